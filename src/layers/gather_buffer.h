// Storage for an all-gathered GEMM operand: `rows` rows of a chunk's kind (same dtype and
// columns; FP8 with its own scale, scale_inv and amax, and a columnwise copy when asked;
// block-scaled with the chunk's block shape, rowwise only), on the chunk's device. Reallocated only
// when the shape, dtype, device or layout changes.
#pragma once

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/tensor.h"

namespace qmesh {

class GatherBuffer {
 public:
  // The storage, valid until the next get() with another shape, dtype or device.
  // `columnwise`: FP8 storage also gets the transposed copy (plain operands have none).
  GemmOperand get(const GemmOperand& chunk, int64_t rows, bool columnwise = false);

 private:
  Tensor plain_;
  QuantizedTensor fp8_;
  BlockQuantizedTensor block_;
};

}  // namespace qmesh
