// GELU (tanh approximation) and its derivative on the host, shared by the GEMM epilogues
// and the layers. Branch-free with a polynomial exp so that row loops vectorize.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace qmesh {

// e^x for x in [-87, 88], relative error ~2e-7: x = n·ln2 + r, e^r by its Taylor polynomial.
inline float exp_approx(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float magic = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504f + magic) - magic;
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const auto bits = static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(bits);
}

// tanh(y) = 1 - 2 / (e^{2y} + 1); absolute error ~1e-7 over all y.
inline float tanh_approx(float y) { return 1.0f - 2.0f / (exp_approx(2.0f * y) + 1.0f); }

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

inline float gelu(float x) {
  const float t = tanh_approx(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  return 0.5f * x * (1.0f + t);
}

inline float dgelu(float x) {
  const float t = tanh_approx(kSqrt2OverPi * (x + kGeluCubic * x * x * x));
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

// r[j] = gelu(r[j]) for j < n.
void gelu_inplace(float* r, int64_t n);
// r[j] *= gelu'(pre[j]) for j < n: backward through GELU given the pre-activation.
void dgelu_mul_inplace(float* r, const float* pre, int64_t n);

}  // namespace qmesh
