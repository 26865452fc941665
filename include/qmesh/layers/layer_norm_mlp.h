// The transformer MLP block with its LayerNorm and residual:
//   y = x + fc2(gelu(fc1(LayerNorm(x))))
// fc1 is column-parallel and fc2 row-parallel over the mesh's tp axis, so the [T, ffn]
// activation never leaves its rank; with sequence_parallel, x and y are sharded on the
// token dimension ([T/tp, hidden]) and LayerNorm runs on the local shard. Everything runs on
// the LayerContext's placement (device and stream). The [T, ffn] tensors between fc1 and fc2
// (the pre-activation, GELU's output under the BF16 recipe, the hidden gradient) are in the
// context's activation_dtype(); x, y and the gradients at the block's boundary are fp32.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "qmesh/export.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/layers/layer_norm.h"

namespace qmesh {

struct LayerNormMLPOptions {
  bool sequence_parallel = false;
  float layer_norm_eps = 1e-5f;
  // Collective-GEMM schedule of fc1 and fc2 under sequence_parallel; unset: the context's.
  std::optional<Overlap> overlap;
  // What fc1 (column parallel) keeps of its gathered input under sequence_parallel.
  GatheredInput gathered_input = GatheredInput::kSave;
};

class QMESH_API LayerNormMLP {
 public:
  // ffn must be divisible by tp. Parameters are drawn from `seed` (see Dense).
  LayerNormMLP(std::string name, int64_t hidden, int64_t ffn, LayerNormMLPOptions options,
               LayerContext& ctx, uint64_t seed);

  // x: fp32 [T, hidden] (sequence_parallel: [T/tp, hidden]) on the context's device. Returns
  // y shaped like x, owned by the block; x must stay alive until backward. On CUDA forward
  // and backward are asynchronous on the context's stream.
  TensorView forward(const TensorView& x);
  // dy shaped like y; writes every parameter's grad and returns dx (owned by the block).
  TensorView backward(const TensorView& dy);

  std::vector<Parameter*> parameters();

 private:
  LayerNorm norm_;
  Dense fc1_, fc2_;
};

// LayerNorm followed by a column-parallel dense layer (as in front of attention's QKV
// projection): y = Dense(LayerNorm(x)). x as for LayerNormMLP; y is [T, out/tp].
class QMESH_API LayerNormDense {
 public:
  LayerNormDense(std::string name, int64_t hidden, int64_t out, bool sequence_parallel,
                 LayerContext& ctx, uint64_t seed);
  TensorView forward(const TensorView& x);
  TensorView backward(const TensorView& dy);
  std::vector<Parameter*> parameters();

 private:
  LayerNorm norm_;
  Dense dense_;
};

}  // namespace qmesh
