// GELU (tanh approximation, the one the GEMM epilogues apply) and its backward:
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// y[i] = gelu(x[i]). x, y: fp32, one shape, one device; y may alias x. Host: blocking. CUDA:
// asynchronous on `stream`.
QMESH_API void gelu(const TensorView& x, const TensorView& y, Stream stream = {});

// dx[i] = dy[i] * gelu'(pre[i]), pre the saved pre-activation. dy, pre, dx: fp32, one shape,
// one device; dx may alias dy (in place). Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void dgelu(const TensorView& dy, const TensorView& pre, const TensorView& dx,
                     Stream stream = {});

}  // namespace qmesh
