// quantize: x -> FP8 codes with a given per-tensor scale (rowwise layout only).
#pragma once

#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// Quantizes x (fp32, bf16 or fp16; same element count as out.data, read as out.data's
// [rows, cols]) with the scale that out.scale points at:
//   out.data[i] = sat_rne(x[i] * *out.scale)   (bit-identical on host and CUDA),
//   *out.scale_inv = 1 / *out.scale,
//   *out.amax = max(*out.amax, max|x|): a running max, NaN-propagating (see ops/amax.h), so
//   that several micro-batches of one step accumulate; it starts at 0 in a new
//   QuantizedTensor and the delayed-scaling update zeroes the history row it points into.
// out.data_t is left untouched: cast_transpose fills both layouts in one pass.
// x and out live on the same device. Host: blocking, multi-threaded for large tensors.
// CUDA: asynchronous on `stream`.
QMESH_API void quantize(const TensorView& x, const QuantizedTensorView& out, Stream stream = {});

}  // namespace qmesh
