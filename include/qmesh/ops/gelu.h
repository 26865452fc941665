// GELU (tanh approximation, the one the GEMM epilogues apply) and its backward:
//   gelu(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// y[i] = gelu(x[i]). x, y: fp32 or bf16 (each; computed in fp32, a bf16 y rounded to nearest
// even), one shape, one device; y may alias x if it has x's dtype. Host: blocking. CUDA:
// asynchronous on `stream`; the same bits as the host for finite values.
QMESH_API void gelu(const TensorView& x, const TensorView& y, Stream stream = {});

// dx[i] = dy[i] * gelu'(pre[i]), pre the saved pre-activation. dy and pre: one dtype, fp32 or
// bf16; dx: fp32; one shape, one device; dx may alias an fp32 dy (in place). Host: blocking. CUDA:
// asynchronous on `stream`.
QMESH_API void dgelu(const TensorView& dy, const TensorView& pre, const TensorView& dx,
                     Stream stream = {});

}  // namespace qmesh
