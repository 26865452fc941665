// LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps) * gamma + beta.
// fp32 tensors on the placement's device (ops/layer_norm.h); statistics in fp32 per row.
#pragma once

#include <string>
#include <vector>

#include "qmesh/export.h"
#include "qmesh/layers/parameter.h"
#include "qmesh/layers/placement.h"
#include "qmesh/tensor.h"

namespace qmesh {

class QMESH_API LayerNorm {
 public:
  // gamma starts at 1, beta at 0, both on placement.device. hidden >= 1, eps > 0.
  LayerNorm(std::string name, int64_t hidden, float eps = 1e-5f, Placement placement = {});

  // x [tokens, hidden] fp32 on placement.device (Error otherwise). Returns y (owned by the layer,
  // valid until the next forward). x must stay alive and unchanged until backward.
  TensorView forward(const TensorView& x);
  // dy [tokens, hidden] like forward's output. Returns dx (owned by the layer) and writes
  // gamma.grad / beta.grad (sums over this call's tokens). On CUDA both calls are
  // asynchronous on placement.stream.
  TensorView backward(const TensorView& dy);

  std::vector<Parameter*> parameters() { return {&gamma_, &beta_}; }
  int64_t hidden() const { return hidden_; }

 private:
  int64_t hidden_;
  float eps_;
  Placement placement_;
  Parameter gamma_, beta_;
  TensorView x_;
  Tensor y_, dx_, mean_, rstd_;
};

}  // namespace qmesh
