#include "qmesh/layers/layer_norm_mlp.h"

#include "layers/activation_buffer.h"
#include "qmesh/comm/stream_ordered.h"
#include "qmesh/error.h"
#include "qmesh/ops/add.h"

namespace qmesh {

namespace {

// Under sequence parallelism each tp rank normalizes different tokens, so the LayerNorm
// parameter gradients are partial sums over tp.
void reduce_norm_grads(LayerNorm& norm, LayerContext& ctx, bool sequence_parallel) {
  if (!sequence_parallel) return;
  const auto tp = ctx.mesh().role(ctx.mesh().resource().tp);
  for (Parameter* p : norm.parameters())
    all_reduce_in_stream_order(*tp, p->grad, ReduceOp::kSum, ctx.stream());
}

std::vector<Parameter*> concat(std::vector<Parameter*> a, const std::vector<Parameter*>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

}  // namespace

LayerNormMLP::LayerNormMLP(std::string name, int64_t hidden, int64_t ffn,
                           LayerNormMLPOptions options, LayerContext& ctx, uint64_t seed)
    : options_(options),
      ctx_(ctx),
      norm_(name + ".ln", hidden, options.layer_norm_eps, ctx.placement()),
      fc1_(name + ".fc1", hidden, ffn,
           DenseOptions{DenseParallelism::kColumn, options.sequence_parallel, true,
                        DenseActivation::kGelu, options.overlap, options.gathered_input},
           ctx, seed * 2 + 1),
      fc2_(name + ".fc2", ffn, hidden,
           DenseOptions{DenseParallelism::kRow, options.sequence_parallel, true,
                        DenseActivation::kNone, options.overlap},
           ctx, seed * 2 + 2) {}

TensorView LayerNormMLP::forward(const TensorView& x) {
  const TensorView out = fc2_.forward(fc1_.forward(norm_.forward(x)));
  check_shape(out, x.shape, "LayerNormMLP output");
  const TensorView y = ensure_tensor(y_, DType::kFloat32, x.shape, x.device);
  add(x, out, y, ctx_.stream());
  return y;
}

TensorView LayerNormMLP::backward(const TensorView& dy) {
  const TensorView d_norm = norm_.backward(fc1_.backward(fc2_.backward(dy)));
  reduce_norm_grads(norm_, ctx_, options_.sequence_parallel);
  const TensorView dx = ensure_tensor(dx_, DType::kFloat32, dy.shape, dy.device);
  add(dy, d_norm, dx, ctx_.stream());  // the residual path
  return dx;
}

std::vector<Parameter*> LayerNormMLP::parameters() {
  return concat(concat(norm_.parameters(), fc1_.parameters()), fc2_.parameters());
}

LayerNormDense::LayerNormDense(std::string name, int64_t hidden, int64_t out,
                               bool sequence_parallel, LayerContext& ctx, uint64_t seed)
    : sequence_parallel_(sequence_parallel),
      ctx_(ctx),
      norm_(name + ".ln", hidden, 1e-5f, ctx.placement()),
      dense_(name + ".dense", hidden, out,
             DenseOptions{DenseParallelism::kColumn, sequence_parallel, true,
                          DenseActivation::kNone, std::nullopt},
             ctx, seed) {}

TensorView LayerNormDense::forward(const TensorView& x) { return dense_.forward(norm_.forward(x)); }

TensorView LayerNormDense::backward(const TensorView& dy) {
  const TensorView dx = norm_.backward(dense_.backward(dy));
  reduce_norm_grads(norm_, ctx_, sequence_parallel_);
  return dx;
}

std::vector<Parameter*> LayerNormDense::parameters() {
  return concat(norm_.parameters(), dense_.parameters());
}

}  // namespace qmesh
