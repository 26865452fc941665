// cast_transpose: quantize into both layouts that Hopper's TN-only FP8 GEMM needs, in one pass.
#pragma once

#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// x is read as its row-major [rows, cols] view (fp32, bf16 or fp16). In one pass over x:
//   out.data   [rows, cols] = sat_rne(x * scale)
//   out.data_t [cols, rows] = the transpose of out.data (same codes)
//   *out.scale_inv = 1 / scale, *out.amax = max(*out.amax, max|x|) (a running
//   max, as quantize.h describes).
// out must have its columnwise copy (QuantizedTensor(..., columnwise=true)).
// Host: blocking, multi-threaded. CUDA: asynchronous on `stream`.
QMESH_API void cast_transpose(const TensorView& x, const QuantizedTensorView& out,
                              Stream stream = {});

}  // namespace qmesh
