// Storage for an all-gathered GEMM operand: `rows` rows of a chunk's kind (same dtype and
// columns; FP8 without a columnwise copy, with its own scale, scale_inv and amax), on the
// chunk's device. Reallocated only when the shape, dtype or device changes.
#pragma once

#include "qmesh/ops/gemm.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/tensor.h"

namespace qmesh {

class GatherBuffer {
 public:
  // The storage, valid until the next get() with another shape, dtype or device.
  GemmOperand get(const GemmOperand& chunk, int64_t rows);

 private:
  Tensor plain_;
  QuantizedTensor fp8_;
};

}  // namespace qmesh
