// Optimizers against their published update rules evaluated in float64.
#include "qmesh/train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "expect_error.h"

namespace qmesh {
namespace {

Parameter param(const std::vector<float>& w, const std::vector<float>& g) {
  Parameter p{"p", Tensor(DType::kFloat32, Shape{int64_t(w.size())}),
              Tensor(DType::kFloat32, Shape{int64_t(w.size())})};
  std::copy(w.begin(), w.end(), p.value.data_as<float>());
  std::copy(g.begin(), g.end(), p.grad.data_as<float>());
  return p;
}

TEST(AdamW, ThreeStepsMatchTheFloat64Rule) {
  const AdamWOptions o{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f};
  const std::vector<float> w0 = {0.5f, -1.0f, 2.0f},
                           grads[3] = {
                               {0.1f, -0.2f, 0.3f}, {0.05f, 0.0f, -0.4f}, {-0.3f, 0.2f, 0.1f}};
  Parameter p = param(w0, grads[0]);
  auto opt = make_adamw({&p}, o);
  std::vector<double> w(w0.begin(), w0.end()), m(3, 0), v(3, 0);
  for (int t = 1; t <= 3; ++t) {
    std::copy(grads[t - 1].begin(), grads[t - 1].end(), p.grad.data_as<float>());
    opt->step();
    for (int i = 0; i < 3; ++i) {
      const double g = grads[t - 1][i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      const double mh = m[i] / (1 - std::pow(0.9, t)), vh = v[i] / (1 - std::pow(0.999, t));
      w[i] -= 0.01 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * w[i]);
    }
  }
  EXPECT_EQ(opt->steps(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p.value.data_as<float>()[i], w[i], 1e-6) << i;
}

TEST(Sgd, MomentumMatchesTheFloat64Rule) {
  Parameter p = param({1.0f, -1.0f}, {0.5f, 0.25f});
  auto opt = make_sgd({&p}, {0.1f, 0.9f, 0.0f});
  double w[2] = {1.0, -1.0}, m[2] = {0, 0};
  const double g[2] = {0.5, 0.25};
  for (int t = 0; t < 2; ++t) {
    opt->step();
    for (int i = 0; i < 2; ++i) {
      m[i] = 0.9 * m[i] + g[i];
      w[i] -= 0.1 * m[i];
    }
  }
  EXPECT_NEAR(p.value.data_as<float>()[0], w[0], 1e-6);
  EXPECT_NEAR(p.value.data_as<float>()[1], w[1], 1e-6);
  EXPECT_EQ(opt->state().size(), 2u);  // step counter + one momentum buffer
}

// A schedule: each step uses the learning rate set before it (SGD with momentum and AdamW,
// against the float64 rules with that step's rate).
TEST(Optimizer, SetLrChangesTheFollowingSteps) {
  const float rates[3] = {0.1f, 0.02f, 0.005f};
  Parameter ps = param({1.0f, -1.0f}, {0.5f, 0.25f}), pa = param({1.0f, -1.0f}, {0.5f, 0.25f});
  auto sgd = make_sgd({&ps}, {rates[0], 0.9f, 0.0f});
  auto adamw = make_adamw({&pa}, {rates[0], 0.9f, 0.999f, 1e-8f, 0.0f});
  double ws[2] = {1.0, -1.0}, m[2] = {0, 0}, wa[2] = {1.0, -1.0}, am[2] = {0, 0}, av[2] = {0, 0};
  const double g[2] = {0.5, 0.25};
  for (int t = 1; t <= 3; ++t) {
    const double lr = rates[t - 1];
    sgd->set_lr(rates[t - 1]);
    adamw->set_lr(rates[t - 1]);
    EXPECT_EQ(sgd->lr(), rates[t - 1]);
    sgd->step();
    adamw->step();
    for (int i = 0; i < 2; ++i) {
      m[i] = 0.9 * m[i] + g[i];
      ws[i] -= lr * m[i];
      am[i] = 0.9 * am[i] + 0.1 * g[i];
      av[i] = 0.999 * av[i] + 0.001 * g[i] * g[i];
      const double mh = am[i] / (1 - std::pow(0.9, t)), vh = av[i] / (1 - std::pow(0.999, t));
      wa[i] -= lr * (mh / (std::sqrt(vh) + 1e-8));
    }
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_NEAR(ps.value.data_as<float>()[i], ws[i], 1e-6) << i;
    EXPECT_NEAR(pa.value.data_as<float>()[i], wa[i], 1e-6) << i;
  }
  EXPECT_QMESH_ERROR(sgd->set_lr(0.0f), "SGD learning rate must be > 0, got 0");
  EXPECT_QMESH_ERROR(adamw->set_lr(-1.0f), "AdamW learning rate must be > 0");
  EXPECT_EQ(adamw->lr(), rates[2]);  // unchanged by the refused values
}

TEST(Optimizer, BadArgumentsAreClearErrors) {
  Parameter p = param({1.0f}, {1.0f});
  EXPECT_QMESH_ERROR(make_adamw({&p}, {-1.0f}), "AdamW learning rate must be > 0");
  EXPECT_QMESH_ERROR(make_adamw({&p}, {0.1f, 1.0f}), "AdamW betas must be in [0, 1)");
  Parameter wrong{"w", Tensor(DType::kBFloat16, Shape{1}), Tensor(DType::kBFloat16, Shape{1})};
  EXPECT_QMESH_ERROR(make_sgd({&wrong}, {}), "w must have dtype fp32, got bf16");
}

}  // namespace
}  // namespace qmesh
