// LayerNorm forward and backward on seeded random inputs, on the host or a CUDA device: what
// the host test (against float64) and the GPU test (against the host) both run.
#pragma once

#include <cstdint>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/ops/layer_norm.h"
#include "random_tensor.h"

namespace qmesh::test {

struct LayerNormRun {
  static constexpr float kEps = 1e-5f;
  // Inputs on the host (x uniform in [-3, 5), the others in [-2, 2); the same for every run
  // of one shape) and outputs on `device`, complete once `stream` has passed them.
  Tensor x, gamma, beta, dy;
  Tensor y, mean, rstd, dx, dgamma, dbeta;

  LayerNormRun(int64_t rows, int64_t cols, Device device = Device::host(), Stream stream = {})
      : x(random_tensor(Shape{rows, cols}, 1, -3.0f, 5.0f)),
        gamma(random_tensor(Shape{cols}, 2)),
        beta(random_tensor(Shape{cols}, 3)),
        dy(random_tensor(Shape{rows, cols}, 4)),
        y(DType::kFloat32, x.shape(), device),
        mean(DType::kFloat32, Shape{rows}, device),
        rstd(DType::kFloat32, Shape{rows}, device),
        dx(DType::kFloat32, x.shape(), device),
        dgamma(DType::kFloat32, Shape{cols}, device),
        dbeta(DType::kFloat32, Shape{cols}, device) {
    for (const Tensor* in : {&x, &gamma, &beta, &dy}) inputs_.push_back(on(*in, device));
    const Tensor &x_in = inputs_[0], &gamma_in = inputs_[1], &beta_in = inputs_[2],
                 &dy_in = inputs_[3];
    layer_norm_forward(x_in, gamma_in, beta_in, kEps, y, mean, rstd, stream);
    layer_norm_backward(dy_in, x_in, gamma_in, mean, rstd, dx, dgamma, dbeta, stream);
  }

 private:
  static Tensor on(const Tensor& t, Device device) {
    Tensor out(t.dtype(), t.shape(), device);
    copy_tensor(out, t);
    return out;
  }
  std::vector<Tensor> inputs_;  // x, gamma, beta, dy on `device`, read by the stream's work
};

}  // namespace qmesh::test
