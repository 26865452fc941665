// The mean-squared-error loss of a regression target, for a global batch split over ranks.
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// For the local part of a global batch of `global_count` elements (y, target, dy: fp32, one
// shape, one device): dy[i] = float(2 (y[i] - target[i]) / global_count), computed in float64,
// and sum_sq (a float64 tensor of one element on the same device) = the float64 sum of
// (y[i] - target[i])^2 over the local elements. Sum sum_sq over the ranks and divide by
// global_count for the loss. Host: blocking, summed in index order. CUDA: asynchronous on
// `stream`; dy is bit-identical to the host's, sum_sq is deterministic (a fixed reduction
// tree) but may differ from the host's in the last bits. Error for bad shapes, dtypes or
// devices, or global_count < y's element count.
QMESH_API void mse_loss(const TensorView& y, const TensorView& target, double global_count,
                        const TensorView& dy, const TensorView& sum_sq, Stream stream = {});

}  // namespace qmesh
