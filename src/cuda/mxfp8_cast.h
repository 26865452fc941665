// The CUDA backend of the MXFP8 casts (cuda/mxfp8_cast.cu); arguments are checked by the
// callers. Each call makes `device` current, enqueues on `stream` and returns at once.
#pragma once

#include "ops/mxfp8_cast_job.h"
#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

void mxfp8_cast(int device, const MxCastJob& job, Stream stream);
void mxfp8_dequantize(int device, const MxDequantizeJob& job, Stream stream);

}  // namespace qmesh::detail::cuda
