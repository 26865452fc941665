#include "qmesh/layers/layer_norm.h"

#include <algorithm>
#include <cmath>

#include "layers/activation_buffer.h"
#include "qmesh/error.h"

namespace qmesh {

namespace {
Parameter filled(std::string name, int64_t n, float value) {
  Parameter p{std::move(name), Tensor(DType::kFloat32, Shape{n}),
              Tensor(DType::kFloat32, Shape{n})};
  std::fill_n(p.value.data_as<float>(), n, value);
  std::fill_n(p.grad.data_as<float>(), n, 0.0f);
  return p;
}
}  // namespace

LayerNorm::LayerNorm(std::string name, int64_t hidden, float eps) : hidden_(hidden), eps_(eps) {
  QMESH_CHECK(hidden >= 1, name, ": hidden size must be >= 1, got ", hidden);
  QMESH_CHECK(eps > 0, name, ": eps must be > 0, got ", eps);
  gamma_ = filled(name + ".gamma", hidden, 1.0f);
  beta_ = filled(name + ".beta", hidden, 0.0f);
}

TensorView LayerNorm::forward(const TensorView& x) {
  check_dtype(x, DType::kFloat32, "LayerNorm input");
  check_device(x, Device::host(), "LayerNorm input");
  QMESH_CHECK(x.shape.cols() == hidden_, gamma_.name, ": input's last dimension must be ", hidden_,
              ", got shape ", x.shape.str());
  const int64_t rows = x.shape.rows();
  x_ = x;
  ensure_tensor(y_, DType::kFloat32, x.shape, Device::host());
  ensure_tensor(mean_, DType::kFloat32, Shape{rows}, Device::host());
  ensure_tensor(rstd_, DType::kFloat32, Shape{rows}, Device::host());
  const float* in = x.data_as<float>();
  const float* g = gamma_.value.data_as<float>();
  const float* b = beta_.value.data_as<float>();
  float* out = y_.data_as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = in + r * hidden_;
    float sum = 0.0f;
    for (int64_t c = 0; c < hidden_; ++c) sum += xr[c];
    const float mean = sum / float(hidden_);
    float sq = 0.0f;
    for (int64_t c = 0; c < hidden_; ++c) sq += (xr[c] - mean) * (xr[c] - mean);
    const float rstd = 1.0f / std::sqrt(sq / float(hidden_) + eps_);
    float* yr = out + r * hidden_;
    for (int64_t c = 0; c < hidden_; ++c) yr[c] = (xr[c] - mean) * rstd * g[c] + b[c];
    mean_.data_as<float>()[r] = mean;
    rstd_.data_as<float>()[r] = rstd;
  }
  return y_.view();
}

TensorView LayerNorm::backward(const TensorView& dy) {
  QMESH_CHECK(!x_.empty(), gamma_.name, ": backward called before forward");
  check_dtype(dy, DType::kFloat32, "LayerNorm output gradient");
  check_shape(dy, x_.shape, "LayerNorm output gradient");
  const int64_t rows = x_.shape.rows();
  ensure_tensor(dx_, DType::kFloat32, x_.shape, Device::host());
  const float* g = gamma_.value.data_as<float>();
  float* dg = gamma_.grad.data_as<float>();
  float* db = beta_.grad.data_as<float>();
  std::fill_n(dg, hidden_, 0.0f);
  std::fill_n(db, hidden_, 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x_.data_as<float>() + r * hidden_;
    const float* dyr = dy.data_as<float>() + r * hidden_;
    float* dxr = dx_.data_as<float>() + r * hidden_;
    const float mean = mean_.data_as<float>()[r], rstd = rstd_.data_as<float>()[r];
    // dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * gamma.
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
    for (int64_t c = 0; c < hidden_; ++c) {
      const float xhat = (xr[c] - mean) * rstd;
      const float dxhat = dyr[c] * g[c];
      sum_dxhat += dxhat;
      sum_dxhat_xhat += dxhat * xhat;
      dg[c] += dyr[c] * xhat;
      db[c] += dyr[c];
    }
    const float inv_n = 1.0f / float(hidden_);
    for (int64_t c = 0; c < hidden_; ++c) {
      const float xhat = (xr[c] - mean) * rstd;
      dxr[c] = rstd * (dyr[c] * g[c] - inv_n * sum_dxhat - xhat * inv_n * sum_dxhat_xhat);
    }
  }
  return dx_.view();
}

}  // namespace qmesh
