// Launcher of the CUDA kernels behind train/loss.h (arguments checked by the caller; makes
// `device` current, enqueues on `stream`, returns at once).
#pragma once

#include <cstdint>

#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

void mse_loss(int device, const float* y, const float* target, double global_count, float* dy,
              double* sum_sq, int64_t n, Stream stream);

}  // namespace qmesh::detail::cuda
