// Turns an fp32 activation or weight (on the context's device) into the GEMM operand that the
// recipe asks for: itself (fp32), a bf16 copy, or FP8 codes with delayed or current scaling.
// Current scaling reduces the tensor's amax over the mesh's amax group first (one small all-reduce
// per operand), so that all ranks holding pieces of one tensor quantize it with one scale. All work
// is ordered on the context's stream (on CUDA the scale never leaves the device). Owns the
// converted storage, which stays valid until the next cast (backward reuses forward's
// operands). A cast can first apply GELU, GELU's backward or a LayerNorm and sum the bias
// gradient (CastFusion): under per-tensor FP8 in the same pass as the quantization
// (ops/activation_cast.h, ops/dbias_quantize.h, ops/norm_forward.h), otherwise in separate
// passes before it. Under block scaling
// (Recipe::kFp8Block) GELU and GELU's backward are separate passes (the fused casts are
// per-tensor only) and the bias gradient is summed in the block cast (block_dbias_quantize);
// the operand is block-scaled with the block shape and QParams the recipe gives its role, with
// its columnwise copy where asked (the block-scaled GEMM reads the copy contiguous along K on
// every backend, so a GEMM that reads the operand transposed needs it on the host too), and no
// amax is reduced across ranks. Under MXFP8 (Recipe::kMxfp8) likewise, with
// mxfp8_quantize / mxfp8_dbias_quantize (1x32 E8M0 blocks; sizes multiples of 32).
#pragma once

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/export.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/scaling/recipe.h"
#include "qmesh/tensor.h"

namespace qmesh {

// What OperandCast::cast does to its input x first: the operand is f(x) with
//   kNone: f(x) = x;   kGelu: gelu(x);   kDgelu: x · gelu'(pre) (x the gradient w.r.t. GELU's
//   output, pre the pre-activation GELU saw, shaped like x and of x's dtype);
//   kLayerNorm: LayerNorm(x) with gamma, beta and eps (x fp32; ops/norm_forward.h), writing
//   mean and rstd (fp32 [rows]) for its backward;
// and if dbias is set (fp32 [cols]; required with kDgelu, only with kNone or kDgelu) it
// receives the column sums of f(x).
struct CastFusion {
  enum class Kind { kNone, kGelu, kDgelu, kLayerNorm } kind = Kind::kNone;
  TensorView pre;
  TensorView dbias;
  TensorView gamma, beta, mean, rstd;  // kLayerNorm
  float eps = 0.0f;
};

class QMESH_API OperandCast {  // exported for its unit test
 public:
  // Registers the operand's scaling state with ctx when the recipe is FP8.
  OperandCast(LayerContext& ctx, OperandRole role);

  // x: fp32 or bf16 (an activation kept in bf16: the BF16 recipe uses it as it is), any 2-D
  // shape. f(x) is computed in fp32. `columnwise` also makes the transposed FP8 copy (what
  // the CUDA GEMM needs for non-TN layouts; block-scaled and MXFP8 GEMMs need it on every
  // backend); without it the operand has none (block scaling and MXFP8 keep the copy's storage
  // of an earlier cast of the same shape, unwritten).
  GemmOperand cast(const TensorView& x, bool columnwise, const CastFusion& fusion = {});

 private:
  // f(x) of `fusion` (owned, fp32; x itself for kNone when x is fp32 or `want_fp32` is
  // false), and its column sums into fusion.dbias: the fusion as separate passes.
  TensorView apply_separately(const TensorView& x, const CastFusion& fusion, bool want_fp32);
  // The FP8 cast of f(x) into q, fused.
  void quantize_fused(const TensorView& x, const CastFusion& fusion, bool columnwise,
                      const QuantizedTensorView& q);
  // The block-scaled cast of f(x) (Recipe::kFp8Block).
  GemmOperand cast_block(const TensorView& x, bool columnwise, const CastFusion& fusion);
  // The MXFP8 cast of f(x) (Recipe::kMxfp8).
  GemmOperand cast_mxfp8(const TensorView& x, bool columnwise, const CastFusion& fusion);

  LayerContext& ctx_;
  OperandRole role_;
  int slot_ = -1;
  int stats_id_ = -1;  // in ctx.fp8_stats(), when it collects
  Tensor bf16_, activated_;
  QuantizedTensor fp8_;
  BlockQuantizedTensor block_;
  MxFp8Tensor mx_;
};

}  // namespace qmesh
