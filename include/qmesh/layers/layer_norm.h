// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta.
// fp32 tensors on its LayerContext's device (ops/layer_norm.h); statistics in fp32 per row.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "qmesh/export.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/layers/parameter.h"
#include "qmesh/tensor.h"

namespace qmesh {

struct CastFusion;  // internal (src/layers/operand_cast.h)

class QMESH_API LayerNorm {
 public:
  // A LayerNorm of a model built on `ctx`, on its placement: gamma starts at 1, beta at 0.
  // hidden >= 1, eps > 0. Under FSDP (ctx.fsdp().enabled())
  // gamma and beta are fsdp-sharded like Dense's parameters (qmesh/layers/fsdp.h): gathered in
  // fp32 before forward and again before backward (gamma; both stay with
  // FsdpOptions::keep_gathered), their gradients reduce-scattered into the shards, in the
  // context's prefetch order. `sequence_parallel`: each tp rank normalizes other tokens, so
  // backward all-reduces the gradients over the mesh's tp axis first.
  LayerNorm(std::string name, int64_t hidden, float eps, LayerContext& ctx, bool sequence_parallel);
  ~LayerNorm();
  LayerNorm(LayerNorm&&) noexcept;
  LayerNorm& operator=(LayerNorm&&) = delete;

  // x [tokens, hidden] fp32 on the context's device (Error otherwise). Returns y (owned by the
  // layer, valid until the next forward). x must stay alive and unchanged until backward.
  TensorView forward(const TensorView& x);
  // dy [tokens, hidden] like forward's output. Returns dx (owned by the layer) and writes
  // gamma.grad / beta.grad (sums over this call's tokens; under FSDP over every data-parallel
  // rank's tokens, into the shards, final after LayerContext::end_step()). On CUDA both calls
  // are asynchronous on the context's stream. With `residual` (fp32, shaped like dy: the
  // gradient of a residual path around the block) dx includes it, added in the same pass.
  TensorView backward(const TensorView& dy, const TensorView& residual = {});

  std::vector<Parameter*> parameters();
  int64_t hidden() const;

 private:
  friend class LayerNormMLP;
  friend class LayerNormDense;
  // Whether the next layer's input cast can compute this norm (fused_forward): a per-tensor
  // FP8 recipe (delayed or current scaling) and no FSDP.
  bool fuses_into_cast() const;
  // forward(x) left to the next layer's input cast: checks and keeps x for backward as forward
  // does, and returns the fusion (kLayerNorm) that computes y = LayerNorm(x) in that cast and
  // writes this layer's mean and rstd. y itself is never written.
  CastFusion fused_forward(const TensorView& x);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qmesh
