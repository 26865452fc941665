#include "qmesh/train/optimizer.h"

#include <algorithm>
#include <cmath>

#include "core/simd.h"
#include "cuda/layer_kernels.h"
#include "qmesh/copy.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"

namespace qmesh {

Optimizer::~Optimizer() = default;

namespace {

void check_param(const Parameter& p) {
  check_dtype(p.value, DType::kFloat32, p.name);
  check_dtype(p.grad, DType::kFloat32, p.name + ".grad");
  check_device(p.grad, p.value.device(), p.name + ".grad");
  check_shape(p.grad, p.value.shape(), p.name + ".grad");
  require_device(p.value.device());
}

// Zeros shaped like t, on t's device (blocking).
Tensor zeros_like(const Tensor& t) {
  Tensor z(t.dtype(), t.shape());
  std::fill_n(z.data_as<float>(), z.numel(), 0.0f);
  return t.device().is_host() ? std::move(z) : clone(z, t.device());
}

// The CUDA device index of p (a CUDA parameter, which check_param's require_device accepted;
// a build without CUDA has none).
int cuda_index(const Parameter& p) { return p.value.device().index; }

void check_lr(float lr, const char* optimizer) {
  QMESH_CHECK(lr > 0, optimizer, " learning rate must be > 0, got ", lr);
}

// The step counter is kept as a tensor so that it is saved with the rest of the state.
class CountedOptimizer : public Optimizer {
 public:
  CountedOptimizer(std::vector<Parameter*> params, Stream stream)
      : params_(std::move(params)), stream_(stream), count_(DType::kInt32, Shape{1}) {
    for (const Parameter* p : params_) check_param(*p);
    *count_.data_as<int32_t>() = 0;
  }
  int64_t steps() const override { return *count_.data_as<int32_t>(); }

 protected:
  std::vector<Parameter*> params_;
  Stream stream_;  // orders the updates of CUDA parameters
  Tensor count_;   // host
};

QMESH_SIMD_CLONES void sgd_update(float* w, const float* g, float* m, int64_t n, SgdOptions o) {
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i];
    if (m) {
      m[i] = o.momentum * m[i] + d;
      d = m[i];
    }
    w[i] -= o.lr * (d + o.weight_decay * w[i]);
  }
}

class Sgd final : public CountedOptimizer {
 public:
  Sgd(std::vector<Parameter*> params, SgdOptions options, Stream stream)
      : CountedOptimizer(std::move(params), stream), options_(options) {
    check_lr(options_.lr, "SGD");
    if (options_.momentum != 0.0f)
      for (const Parameter* p : params_) momentum_.push_back(zeros_like(p->value));
  }
  void step() override {
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter& p = *params_[i];
      float* m = momentum_.empty() ? nullptr : momentum_[i].data_as<float>();
      if (p.value.device().is_host()) {
        sgd_update(p.value.data_as<float>(), p.grad.data_as<float>(), m, p.value.numel(), options_);
        continue;
      }
      detail::on_cuda(cuda_index(p), [&](auto device) {
        detail::cuda::sgd_update(device, p.value.data_as<float>(), p.grad.data_as<float>(), m,
                                 p.value.numel(), options_.lr, options_.momentum,
                                 options_.weight_decay, stream_);
      });
    }
    ++*count_.data_as<int32_t>();
  }
  float lr() const override { return options_.lr; }
  void set_lr(float lr) override {
    check_lr(lr, "SGD");
    options_.lr = lr;
  }
  std::vector<std::pair<std::string, Tensor*>> state() override {
    std::vector<std::pair<std::string, Tensor*>> out{{"optimizer.step", &count_}};
    for (size_t i = 0; i < momentum_.size(); ++i)
      out.emplace_back(params_[i]->name + ".momentum", &momentum_[i]);
    return out;
  }

 private:
  SgdOptions options_;
  std::vector<Tensor> momentum_;
};

QMESH_SIMD_CLONES void adamw_update(float* w, const float* g, float* m, float* v, int64_t n,
                                    AdamWOptions o, float bias1, float bias2) {
  for (int64_t i = 0; i < n; ++i) {
    m[i] = o.beta1 * m[i] + (1.0f - o.beta1) * g[i];
    v[i] = o.beta2 * v[i] + (1.0f - o.beta2) * g[i] * g[i];
    const float m_hat = m[i] / bias1, v_hat = v[i] / bias2;
    w[i] -= o.lr * (m_hat / (std::sqrt(v_hat) + o.eps) + o.weight_decay * w[i]);
  }
}

class AdamW final : public CountedOptimizer {
 public:
  AdamW(std::vector<Parameter*> params, AdamWOptions options, Stream stream)
      : CountedOptimizer(std::move(params), stream), options_(options) {
    check_lr(options_.lr, "AdamW");
    for (const Parameter* p : params_) {
      m_.push_back(zeros_like(p->value));
      v_.push_back(zeros_like(p->value));
    }
  }
  void step() override {
    const int32_t t = ++*count_.data_as<int32_t>();
    const float bias1 = 1.0f - std::pow(options_.beta1, float(t));
    const float bias2 = 1.0f - std::pow(options_.beta2, float(t));
    for (size_t i = 0; i < params_.size(); ++i) {
      Parameter& p = *params_[i];
      if (p.value.device().is_host()) {
        adamw_update(p.value.data_as<float>(), p.grad.data_as<float>(), m_[i].data_as<float>(),
                     v_[i].data_as<float>(), p.value.numel(), options_, bias1, bias2);
        continue;
      }
      detail::on_cuda(cuda_index(p), [&](auto device) {
        detail::cuda::adamw_update(device, p.value.data_as<float>(), p.grad.data_as<float>(),
                                   m_[i].data_as<float>(), v_[i].data_as<float>(), p.value.numel(),
                                   options_.lr, options_.beta1, options_.beta2, options_.eps,
                                   options_.weight_decay, bias1, bias2, stream_);
      });
    }
  }
  float lr() const override { return options_.lr; }
  void set_lr(float lr) override {
    check_lr(lr, "AdamW");
    options_.lr = lr;
  }
  std::vector<std::pair<std::string, Tensor*>> state() override {
    std::vector<std::pair<std::string, Tensor*>> out{{"optimizer.step", &count_}};
    for (size_t i = 0; i < params_.size(); ++i) {
      out.emplace_back(params_[i]->name + ".adam_m", &m_[i]);
      out.emplace_back(params_[i]->name + ".adam_v", &v_[i]);
    }
    return out;
  }

 private:
  AdamWOptions options_;
  std::vector<Tensor> m_, v_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sgd(std::vector<Parameter*> params, SgdOptions options,
                                    Stream stream) {
  return std::make_unique<Sgd>(std::move(params), options, stream);
}

std::unique_ptr<Optimizer> make_adamw(std::vector<Parameter*> params, AdamWOptions options,
                                      Stream stream) {
  QMESH_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
              "AdamW betas must be in [0, 1), got ", options.beta1, ", ", options.beta2);
  return std::make_unique<AdamW>(std::move(params), options, stream);
}

}  // namespace qmesh
