// dequantize: FP8 codes -> a wide float tensor.
#pragma once

#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// out[i] = decode(q.data[i]) * *q.scale_inv, computed in fp32 and rounded (nearest-even) to
// out's dtype (fp32, bf16 or fp16). out has q.data's element count and device.
// Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void dequantize(const QuantizedTensorView& q, const TensorView& out, Stream stream = {});

}  // namespace qmesh
