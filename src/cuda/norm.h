// The CUDA backend of norm_forward (cuda/norm.cu); arguments are checked by the caller.
#pragma once

#include "ops/norm_job.h"
#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

// Run on CUDA device `device` (made current for the call), ordered on `stream`.
void norm_forward(int device, const NormJob& job, Stream stream);

}  // namespace qmesh::detail::cuda
