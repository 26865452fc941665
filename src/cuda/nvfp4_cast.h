// The CUDA backend of the NVFP4 casts (cuda/nvfp4_cast.cu); arguments are checked by the
// callers. Each call makes `device` current, enqueues on `stream` and returns at once.
#pragma once

#include <cstdint>

#include "ops/nvfp4_cast_job.h"
#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

void nvfp4_cast(int device, const NvFp4CastJob& job, Stream stream);
// As cpu::nvfp4_dequantize, on CUDA device `device`.
void nvfp4_dequantize(int device, const uint8_t* data, const uint8_t* scale, const float* scale_inv,
                      int64_t rows, int64_t cols, void* out, DType out_dtype, Stream stream);

}  // namespace qmesh::detail::cuda
