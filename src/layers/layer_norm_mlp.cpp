#include "qmesh/layers/layer_norm_mlp.h"

#include "layers/operand_cast.h"
#include "qmesh/error.h"

namespace qmesh {

namespace {

// Under FP8 GELU runs inside the casts around it: fc1's output is the pre-activation, fc2's
// input cast applies GELU, and fc1's dy cast applies GELU's backward with the bias gradient.
// fc1's output, and with it fc2's input and input gradient (the [T, ffn] tensors), are in the
// context's activation_dtype; fc2's output stays fp32 (reduced over tp, then the residual).
DenseGeluSplit gelu_split(const LayerContext& ctx, DenseGeluSplit side) {
  return ctx.is_fp8() ? side : DenseGeluSplit::kNone;
}

std::vector<Parameter*> concat(std::vector<Parameter*> a, const std::vector<Parameter*>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

LayerNormMLP::LayerNormMLP(std::string name, int64_t hidden, int64_t ffn,
                           LayerNormMLPOptions options, LayerContext& ctx, uint64_t seed)
    : norm_(name + ".ln", hidden, options.layer_norm_eps, ctx, options.sequence_parallel),
      fc1_(name + ".fc1", hidden, ffn,
           DenseOptions{DenseParallelism::kColumn, options.sequence_parallel, true,
                        DenseActivation::kGelu, options.overlap, options.gathered_input,
                        gelu_split(ctx, DenseGeluSplit::kProducer), ctx.activation_dtype()},
           ctx, seed * 2 + 1),
      fc2_(name + ".fc2", ffn, hidden,
           DenseOptions{DenseParallelism::kRow, options.sequence_parallel, true,
                        DenseActivation::kNone, options.overlap, GatheredInput::kSave,
                        gelu_split(ctx, DenseGeluSplit::kConsumer)},
           ctx, seed * 2 + 2) {}

TensorView LayerNormMLP::forward(const TensorView& x) {
  // Under per-tensor FP8 the LayerNorm runs inside fc1's input cast (norm_forward): its output
  // is never written in fp32, only as fc1's FP8 codes.
  const TensorView h = norm_.fuses_into_cast() ? fc1_.forward_fused(x, norm_.fused_forward(x))
                                               : fc1_.forward(norm_.forward(x));
  // fc2 adds the residual: in its GEMM at tp = 1 (with its bias), else after the reduction.
  return fc2_.forward(h, x);
}

TensorView LayerNormMLP::backward(const TensorView& dy) {
  check_dtype(dy, DType::kFloat32, "LayerNormMLP output gradient");
  // LayerNorm's dx with the residual path's dy added in its pass.
  return norm_.backward(fc1_.backward(fc2_.backward(dy)), dy);
}

std::vector<Parameter*> LayerNormMLP::parameters() {
  return concat(concat(norm_.parameters(), fc1_.parameters()), fc2_.parameters());
}

LayerNormDense::LayerNormDense(std::string name, int64_t hidden, int64_t out,
                               bool sequence_parallel, LayerContext& ctx, uint64_t seed)
    : norm_(name + ".ln", hidden, 1e-5f, ctx, sequence_parallel),
      dense_(name + ".dense", hidden, out,
             DenseOptions{DenseParallelism::kColumn, sequence_parallel, true,
                          DenseActivation::kNone, std::nullopt},
             ctx, seed) {}

TensorView LayerNormDense::forward(const TensorView& x) {  // as LayerNormMLP's fc1
  return norm_.fuses_into_cast() ? dense_.forward_fused(x, norm_.fused_forward(x))
                                 : dense_.forward(norm_.forward(x));
}

TensorView LayerNormDense::backward(const TensorView& dy) {
  return norm_.backward(dense_.backward(dy));
}

std::vector<Parameter*> LayerNormDense::parameters() {
  return concat(norm_.parameters(), dense_.parameters());
}

}  // namespace qmesh
