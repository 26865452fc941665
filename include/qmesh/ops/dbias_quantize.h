// dbias_quantize: quantize an output gradient and reduce its bias gradient in the same pass.
#pragma once

#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// g is the output gradient, read as [rows, cols] (fp32, bf16 or fp16). In one pass:
//   out.data (and out.data_t if out has a columnwise copy) as cast_transpose / quantize,
//   *out.scale_inv = 1 / scale, *out.amax = max(*out.amax, max|g|) (running, as quantize),
//   dbias[c] = sum over rows r of g[r, c]   (fp32 [cols], accumulated in fp32).
// The summation order is fixed for a given shape and device (deterministic), but differs
// between host and CUDA, so the two agree to fp32 rounding, not bitwise.
// Host: blocking. CUDA: asynchronous on `stream` (uses a stream-ordered scratch allocation).
QMESH_API void dbias_quantize(const TensorView& g, const QuantizedTensorView& out,
                              const TensorView& dbias, Stream stream = {});

}  // namespace qmesh
