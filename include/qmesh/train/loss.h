// The mean-squared-error loss of a regression target, for a global batch split over ranks.
#pragma once

#include "qmesh/comm/mesh.h"
#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// For the local part of a global batch of `global_count` elements (y, target, dy: fp32, one
// shape, one device): dy[i] = float(2 (y[i] - target[i]) / global_count), computed in float64,
// and sum_sq (a float64 tensor of one element on the same device) = the float64 sum of
// (y[i] - target[i])^2 over the local elements. For the loss, sum sum_sq over the ranks that
// hold distinct elements (not over tp ranks holding replicated outputs) and divide by
// global_count; the overload below does that. Host: blocking, summed in index order. CUDA:
// asynchronous on `stream`; dy is bit-identical to the host's, sum_sq is deterministic (a fixed
// reduction tree) but may differ from the host's in the last bits. Error for bad shapes, dtypes or
// devices, or global_count < y's element count.
QMESH_API void mse_loss(const TensorView& y, const TensorView& target, double global_count,
                        const TensorView& dy, const TensorView& sum_sq, Stream stream = {});

// Where a model's outputs lie over the mesh: distinct over the data-parallel ranks (the axes of
// the mesh's dp and fsdp roles) and, under sequence parallelism, also over the tp role's
// ranks (each holds its token slice); otherwise the tp ranks hold the same, replicated outputs.
enum class LossOutputs { kReplicatedOverTp, kSplitOverTp };

// The global mean-squared error of a batch split over `mesh` as `outputs` says, every rank
// holding as many elements as y (fp32, on the layers' device): writes dy (as above, with the
// global element count) and returns the loss, reduced over the ranks that hold distinct
// elements (so replicated outputs are counted once). Collective over those ranks, on the
// mesh's communicators (host buffers on the host, device buffers on CUDA); blocking: on CUDA
// it waits for `stream`.
QMESH_API double mse_loss(const Mesh& mesh, LossOutputs outputs, const TensorView& y,
                          const TensorView& target, const TensorView& dy, Stream stream = {});

}  // namespace qmesh
