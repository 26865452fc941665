// amax: the largest magnitude max|x| of a tensor, as delayed and current scaling need it.
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// Writes max|x| over all elements of x (fp32, bf16 or fp16, any shape) into `out`, an fp32
// tensor of one element on x's device (overwritten, not max-accumulated).
//
// NaN policy (the same in every op that computes an amax): NaN propagates. amax is the
// largest |x| compared as IEEE bit patterns with the sign cleared, so any NaN input makes the
// amax a NaN (and +inf beats every finite value). This is TransformerEngine's behaviour; the
// delayed-scaling update then keeps the previous scale (docs/design/fp8_scaling.md).
//
// Host tensors: blocking. CUDA tensors: asynchronous on `stream`.
QMESH_API void amax(const TensorView& x, const TensorView& out, Stream stream = {});

}  // namespace qmesh
