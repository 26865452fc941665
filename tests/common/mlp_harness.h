// Test harness for LayerNormMLP: a float64 reference of the block, and a driver that runs
// the block sharded over a dp x tp mesh and gathers its outputs and gradients back into the
// global (unsharded) layout, so that any sharding can be compared with the unsharded block.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/layers/fsdp.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/random.h"

namespace qmesh::testing_mlp {

// Global (unsharded) parameters or gradients of one block, in float64, row-major.
struct MlpParams {
  std::vector<double> gamma, beta;  // [hidden]
  std::vector<double> w1, b1;       // [ffn, hidden], [ffn]
  std::vector<double> w2, b2;       // [hidden, ffn], [hidden]
};

struct MlpRun {
  std::vector<double> y, dx;  // [tokens, hidden] of the last step
  MlpParams grads;            // summed over every token of the last step
};

inline double rel_norm(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num / (den > 0 ? den : 1));
}

// The values of an fp32 host tensor, widened.
inline std::vector<double> doubles(const TensorView& t) {
  const float* p = t.data_as<float>();
  return std::vector<double>(p, p + t.numel());
}

inline double gelu(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
inline double dgelu(double x) {
  const double t = std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
}

// y = x + fc2(gelu(fc1(LayerNorm(x)))) in float64; with dy, also every gradient.
inline MlpRun reference(const MlpParams& p, const std::vector<double>& x,
                        const std::vector<double>& dy, int64_t tokens, int64_t hidden, int64_t ffn,
                        double eps = 1e-5) {
  const int64_t T = tokens, H = hidden, F = ffn;
  std::vector<double> xhat(T * H), rstd(T), h(T * H), a(T * F), g(T * F);
  MlpRun r;
  r.y.assign(T * H, 0);
  for (int64_t t = 0; t < T; ++t) {
    double mean = 0, var = 0;
    for (int64_t c = 0; c < H; ++c) mean += x[t * H + c];
    mean /= double(H);
    for (int64_t c = 0; c < H; ++c) var += (x[t * H + c] - mean) * (x[t * H + c] - mean);
    rstd[t] = 1 / std::sqrt(var / double(H) + eps);
    for (int64_t c = 0; c < H; ++c) {
      xhat[t * H + c] = (x[t * H + c] - mean) * rstd[t];
      h[t * H + c] = xhat[t * H + c] * p.gamma[c] + p.beta[c];
    }
    for (int64_t j = 0; j < F; ++j) {
      double s = p.b1[j];
      for (int64_t c = 0; c < H; ++c) s += h[t * H + c] * p.w1[j * H + c];
      a[t * F + j] = s;
      g[t * F + j] = gelu(s);
    }
    for (int64_t c = 0; c < H; ++c) {
      double s = p.b2[c];
      for (int64_t j = 0; j < F; ++j) s += g[t * F + j] * p.w2[c * F + j];
      r.y[t * H + c] = x[t * H + c] + s;
    }
  }
  if (dy.empty()) return r;
  MlpParams& d = r.grads;
  d.gamma.assign(H, 0), d.beta.assign(H, 0), d.w1.assign(F * H, 0), d.b1.assign(F, 0);
  d.w2.assign(H * F, 0), d.b2.assign(H, 0);
  r.dx.assign(T * H, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> da(F), dh(H, 0);
    for (int64_t c = 0; c < H; ++c) {
      d.b2[c] += dy[t * H + c];
      for (int64_t j = 0; j < F; ++j) d.w2[c * F + j] += dy[t * H + c] * g[t * F + j];
    }
    for (int64_t j = 0; j < F; ++j) {
      double dg = 0;
      for (int64_t c = 0; c < H; ++c) dg += dy[t * H + c] * p.w2[c * F + j];
      da[j] = dg * dgelu(a[t * F + j]);
      d.b1[j] += da[j];
      for (int64_t c = 0; c < H; ++c) {
        d.w1[j * H + c] += da[j] * h[t * H + c];
        dh[c] += da[j] * p.w1[j * H + c];
      }
    }
    double sum_dxhat = 0, sum_dxhat_xhat = 0;
    for (int64_t c = 0; c < H; ++c) {
      d.gamma[c] += dh[c] * xhat[t * H + c];
      d.beta[c] += dh[c];
      sum_dxhat += dh[c] * p.gamma[c];
      sum_dxhat_xhat += dh[c] * p.gamma[c] * xhat[t * H + c];
    }
    for (int64_t c = 0; c < H; ++c) {
      const double dxhat = dh[c] * p.gamma[c];
      r.dx[t * H + c] = dy[t * H + c] + rstd[t] * (dxhat - sum_dxhat / double(H) -
                                                   xhat[t * H + c] * sum_dxhat_xhat / double(H));
    }
  }
  return r;
}

// Deterministic test data: element i of step s.
inline std::vector<double> sample(uint64_t seed, int step, int64_t n) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[i] = counter_normal(mix_seed(seed, uint64_t(step)), uint64_t(i));
  return v;
}

// Every output and gradient of `got` has the same bits as `want`'s (gtest expectations).
inline void expect_bitwise_equal(const MlpRun& got, const MlpRun& want, const std::string& what) {
  EXPECT_EQ(got.y, want.y) << what;
  EXPECT_EQ(got.dx, want.dx) << what;
  EXPECT_EQ(got.grads.gamma, want.grads.gamma) << what;
  EXPECT_EQ(got.grads.beta, want.grads.beta) << what;
  EXPECT_EQ(got.grads.w1, want.grads.w1) << what;
  EXPECT_EQ(got.grads.b1, want.grads.b1) << what;
  EXPECT_EQ(got.grads.w2, want.grads.w2) << what;
  EXPECT_EQ(got.grads.b2, want.grads.b2) << what;
}

struct ShardedCase {
  int dp = 1, tp = 1;
  int fsdp = 1;              // > 1: a third mesh axis (dp, fsdp, tp) with the fsdp role
  FsdpOptions fsdp_options;  // prefetch depth, keep_gathered
  bool sequence_parallel = false;
  Recipe recipe = Recipe::kFp32;
  int64_t hidden = 24, ffn = 48, tokens_per_dp = 12;
  int steps = 2;  // > 1 exercises the delayed-scaling update between steps
  uint64_t seed = 7;
  Overlap overlap = Overlap::kNone;  // the context's collective-GEMM schedule (with sp)
  GatheredInput gathered_input = GatheredInput::kSave;  // fc1's, with sp
  std::optional<DType> activation_dtype;                // unset: the recipe's default
  // Where the block runs (each rank's own stream on CUDA); inputs are copied there and the
  // results back to the host.
  Placement placement;
};

// Collective over `world` (dp * fsdp * tp ranks, or 1 for the unsharded block): runs `steps`
// forward/backward passes of one LayerNormMLP on the global batch of each step (every data
// rank takes its slice), calling end_step() in between, and returns the last step's global
// outputs and gradients summed over the data ranks, unsharded (fsdp) and tp-gathered
// (identical on every rank).
MlpRun run_sharded(const std::shared_ptr<Communicator>& world, const ShardedCase& c);

// The block's global parameters (from an unsharded block built with the case's seed).
MlpParams initial_params(const ShardedCase& c);

// The float64 reference of the case's first step (the global batch of step 0).
inline MlpRun reference_of(const ShardedCase& c) {
  const int64_t T = c.tokens_per_dp * c.dp;
  return reference(initial_params(c), sample(c.seed + 1, 0, T * c.hidden),
                   sample(c.seed + 2, 0, T * c.hidden), T, c.hidden, c.ffn);
}

// A non-owning shared_ptr to a communicator (e.g. the one run_local_ranks lends a thread).
inline std::shared_ptr<Communicator> borrowed(Communicator& comm) {
  return std::shared_ptr<Communicator>(&comm, [](Communicator*) {});
}

}  // namespace qmesh::testing_mlp
