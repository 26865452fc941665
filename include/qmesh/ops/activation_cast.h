// Casts fused with GELU's forward and backward: the FP8 path of a GELU MLP never writes the
// activated [tokens, ffn] tensor, or its gradient, in a wide type.
//
// GELU is the tanh approximation of ops/gelu.h, computed with one sequence of fp32 operations
// on the host and on CUDA, so that both give the same codes and amax bit for bit. A NaN
// result (from a NaN input, or GELU of -inf) counts as the canonical NaN 0x7FFFFFFF in the
// amax, which is NaN-propagating as in ops/amax.h.
#pragma once

#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// pre is the pre-activation, read as out.data's [rows, cols] (fp32, bf16 or fp16). In one pass:
//   out.data = sat_rne(gelu(pre) * scale), and out.data_t its transpose if out has the
//   columnwise copy; *out.scale_inv = 1 / scale; *out.amax = max(*out.amax, max|gelu(pre)|)
//   (running, as quantize.h).
// Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void gelu_cast_transpose(const TensorView& pre, const QuantizedTensorView& out,
                                   Stream stream = {});

// dh is the gradient w.r.t. GELU's output and pre the saved pre-activation, one dtype (fp32,
// bf16 or fp16) and out.data's [rows, cols]. With g = dh · gelu'(pre), in one pass:
//   out.data (and out.data_t if present), out.scale_inv and out.amax as above for g,
//   dbias[c] = sum over rows r of g[r, c] (fp32 [cols]; the summation order differs between
//   host and CUDA: they agree to fp32 rounding, as dbias_quantize).
// Host: blocking. CUDA: asynchronous on `stream` (a stream-ordered scratch allocation).
QMESH_API void dgelu_dbias_cast_transpose(const TensorView& dh, const TensorView& pre,
                                          const QuantizedTensorView& out, const TensorView& dbias,
                                          Stream stream = {});

// The amax the casts above would take, for current scaling's scale before the cast:
// *out = max|gelu(pre)|, or max|dh · gelu'(pre)| (fp32 [1], replaced, not a running max).
QMESH_API void gelu_amax(const TensorView& pre, const TensorView& out, Stream stream = {});
QMESH_API void dgelu_amax(const TensorView& dh, const TensorView& pre, const TensorView& out,
                          Stream stream = {});

}  // namespace qmesh
