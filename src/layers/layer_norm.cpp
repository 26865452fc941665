#include "qmesh/layers/layer_norm.h"

#include <algorithm>

#include "layers/activation_buffer.h"
#include "layers/parameter_init.h"
#include "qmesh/error.h"
#include "qmesh/ops/layer_norm.h"

namespace qmesh {

namespace {
Parameter filled(std::string name, int64_t n, float value, Device device) {
  Tensor host(DType::kFloat32, Shape{n});
  std::fill_n(host.data_as<float>(), n, value);
  return make_parameter(std::move(name), std::move(host), device);
}
}  // namespace

LayerNorm::LayerNorm(std::string name, int64_t hidden, float eps, Placement placement)
    : hidden_(hidden), eps_(eps), placement_(placement) {
  QMESH_CHECK(hidden >= 1, name, ": hidden size must be >= 1, got ", hidden);
  QMESH_CHECK(eps > 0, name, ": eps must be > 0, got ", eps);
  gamma_ = filled(name + ".gamma", hidden, 1.0f, placement.device);
  beta_ = filled(name + ".beta", hidden, 0.0f, placement.device);
}

TensorView LayerNorm::forward(const TensorView& x) {
  const Device device = placement_.device;
  check_dtype(x, DType::kFloat32, "LayerNorm input");
  check_device(x, device, "LayerNorm input");
  QMESH_CHECK(x.shape.cols() == hidden_, gamma_.name, ": input's last dimension must be ", hidden_,
              ", got shape ", x.shape.str());
  const int64_t rows = x.shape.rows();
  x_ = x;
  layer_norm_forward(x, gamma_.value, beta_.value, eps_,
                     ensure_tensor(y_, DType::kFloat32, x.shape, device),
                     ensure_tensor(mean_, DType::kFloat32, Shape{rows}, device),
                     ensure_tensor(rstd_, DType::kFloat32, Shape{rows}, device), placement_.stream);
  return y_.view();
}

TensorView LayerNorm::backward(const TensorView& dy) {
  QMESH_CHECK(!x_.empty(), gamma_.name, ": backward called before forward");
  check_dtype(dy, DType::kFloat32, "LayerNorm output gradient");
  check_device(dy, placement_.device, "LayerNorm output gradient");
  check_shape(dy, x_.shape, "LayerNorm output gradient");
  layer_norm_backward(dy, x_, gamma_.value, mean_, rstd_,
                      ensure_tensor(dx_, DType::kFloat32, x_.shape, placement_.device), gamma_.grad,
                      beta_.grad, placement_.stream);
  return dx_.view();
}

}  // namespace qmesh
