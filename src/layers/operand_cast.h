// Turns an fp32 activation or weight (on the context's device) into the GEMM operand that the
// recipe asks for: itself (fp32), a bf16 copy, or FP8 codes with delayed or current scaling.
// Current scaling reduces the tensor's amax over the mesh's amax group first (one small all-reduce
// per operand), so that all ranks holding pieces of one tensor quantize it with one scale. All work
// is ordered on the context's stream (on CUDA the scale never leaves the device). Owns the
// converted storage, which stays valid until the next cast (backward reuses forward's
// operands).
#pragma once

#include "qmesh/layers/layer_context.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/scaling/recipe.h"
#include "qmesh/tensor.h"

namespace qmesh {

class OperandCast {
 public:
  // Registers the operand's scaling state with ctx when the recipe is FP8.
  OperandCast(LayerContext& ctx, OperandRole role);

  // x: fp32, any 2-D shape. `columnwise` also makes the transposed FP8 copy (what the CUDA
  // GEMM needs for non-TN layouts).
  GemmOperand cast(const TensorView& x, bool columnwise);

 private:
  LayerContext& ctx_;
  OperandRole role_;
  int slot_ = -1;
  int stats_id_ = -1;  // in ctx.fp8_stats(), when it collects
  Tensor bf16_;
  QuantizedTensor fp8_;
};

}  // namespace qmesh
