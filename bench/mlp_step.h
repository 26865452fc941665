// One LayerNormMLP block and its training step (forward, backward, end_step) on a one-rank
// mesh, shared by the dense benchmarks. Inputs are drawn on the host and copied to the
// placement's device.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "qmesh/comm/mesh.h"
#include "qmesh/copy.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/random.h"

namespace bench {

class MlpStep {
 public:
  // `world`: a one-rank communicator carrying buffers of placement.device. activation_dtype:
  // LayerContextOptions::activation_dtype (unset: the recipe's default).
  MlpStep(std::shared_ptr<qmesh::Communicator> world, qmesh::Recipe recipe, int64_t tokens,
          int64_t hidden, int64_t ffn, qmesh::Placement placement,
          std::optional<qmesh::DType> activation_dtype = std::nullopt)
      : mesh_(std::move(world), {{"dp", 1}, {"tp", 1}}),
        ctx_(mesh_, recipe, {.placement = placement, .activation_dtype = activation_dtype}),
        block_("mlp", hidden, ffn, {}, ctx_, 1) {
    qmesh::Tensor x(qmesh::DType::kFloat32, qmesh::Shape{tokens, hidden}), dy(x.dtype(), x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data_as<float>()[i] = qmesh::counter_normal(1, uint64_t(i));
      dy.data_as<float>()[i] = 1e-3f * qmesh::counter_normal(2, uint64_t(i));
    }
    x_ = qmesh::clone(x, placement.device);
    dy_ = qmesh::clone(dy, placement.device);
  }

  // Forward + backward + end_step; on CUDA enqueued on the placement's stream (not waited for).
  void run() {
    block_.forward(x_);
    block_.backward(dy_);
    ctx_.end_step();
  }

  // Floating-point operations of one step: three GEMMs per linear layer, 2 flops per MAC.
  static double flops(int64_t tokens, int64_t hidden, int64_t ffn) {
    return 12.0 * double(tokens) * double(hidden) * double(ffn);
  }

 private:
  qmesh::Mesh mesh_;
  qmesh::LayerContext ctx_;
  qmesh::LayerNormMLP block_;
  qmesh::Tensor x_, dy_;
};

}  // namespace bench
