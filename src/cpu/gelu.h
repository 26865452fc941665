// GELU (tanh approximation) and its derivative: one definition for the host (GEMM epilogues,
// layers, the fused casts) and the CUDA casts that fuse GELU (cuda/cast.cu). Branch-free with
// a polynomial exp so that row loops vectorize. Every operation is rounded as written: on the
// device through __fmul_rn / __fadd_rn / __fdiv_rn, which nvcc never contracts into a fused
// multiply-add; on the host the translation unit that must match the device bit for bit
// (cpu/cast.cpp) is compiled with -ffp-contract=off (src/cpu/sources.cmake).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define QMESH_HOST_DEVICE __host__ __device__
#else
#define QMESH_HOST_DEVICE
#endif

namespace qmesh {

namespace gelu_detail {

#if defined(__CUDA_ARCH__)
QMESH_HOST_DEVICE inline float mul(float a, float b) { return __fmul_rn(a, b); }
QMESH_HOST_DEVICE inline float add(float a, float b) { return __fadd_rn(a, b); }
QMESH_HOST_DEVICE inline float sub(float a, float b) { return __fsub_rn(a, b); }
QMESH_HOST_DEVICE inline float div(float a, float b) { return __fdiv_rn(a, b); }
QMESH_HOST_DEVICE inline float from_bits(uint32_t b) { return __uint_as_float(b); }
#else
inline float mul(float a, float b) { return a * b; }
inline float add(float a, float b) { return a + b; }
inline float sub(float a, float b) { return a - b; }
inline float div(float a, float b) { return a / b; }
inline float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, sizeof f);
  return f;
}
#endif

// The canonical NaN 0x7FFFFFFF for any NaN, so that both backends write one value (x86
// arithmetic keeps an input NaN's payload, the GPU's does not).
QMESH_HOST_DEVICE inline float canonical_nan(float v) {
  return v == v ? v : from_bits(0x7FFFFFFFu);
}

}  // namespace gelu_detail

// e^x for x in [-87, 88], relative error ~2e-7: x = n·ln2 + r, e^r by its Taylor polynomial.
// NaN stays NaN.
QMESH_HOST_DEVICE inline float exp_approx(float x) {
  using namespace gelu_detail;
  x = x < -87.0f ? -87.0f : x;
  x = x > 88.0f ? 88.0f : x;
  const float magic = 12582912.0f;  // 1.5 · 2^23: adding it rounds to an integer
  float n = sub(add(mul(x, 1.44269504f), magic), magic);
  n = n == n ? n : 0.0f;  // NaN: the polynomial below is NaN already; no NaN -> int conversion
  const float r = sub(sub(x, mul(n, 0.693145751953125f)), mul(n, 1.428606765330187e-06f));
  float p = 1.0f / 720.0f;
  p = add(mul(p, r), 1.0f / 120.0f);
  p = add(mul(p, r), 1.0f / 24.0f);
  p = add(mul(p, r), 1.0f / 6.0f);
  p = add(mul(p, r), 0.5f);
  p = add(mul(p, r), 1.0f);
  p = add(mul(p, r), 1.0f);
  return mul(p, from_bits(static_cast<uint32_t>(static_cast<int32_t>(n) + 127) << 23));
}

// tanh(y) = 1 - 2 / (e^{2y} + 1); absolute error ~1e-7 over all y.
QMESH_HOST_DEVICE inline float tanh_approx(float y) {
  using namespace gelu_detail;
  return sub(1.0f, div(2.0f, add(exp_approx(mul(2.0f, y)), 1.0f)));
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kGeluCubic = 0.044715f;

// tanh(sqrt(2/pi) (x + 0.044715 x^3)).
QMESH_HOST_DEVICE inline float gelu_tanh(float x) {
  using namespace gelu_detail;
  return tanh_approx(mul(kSqrt2OverPi, add(x, mul(mul(mul(kGeluCubic, x), x), x))));
}

QMESH_HOST_DEVICE inline float gelu(float x) {
  using namespace gelu_detail;
  return mul(mul(0.5f, x), add(1.0f, gelu_tanh(x)));
}

QMESH_HOST_DEVICE inline float dgelu(float x) {
  using namespace gelu_detail;
  const float t = gelu_tanh(x);
  const float du = mul(kSqrt2OverPi, add(1.0f, mul(mul(3.0f * kGeluCubic, x), x)));
  return add(mul(0.5f, add(1.0f, t)), mul(mul(mul(0.5f, x), sub(1.0f, mul(t, t))), du));
}

// r[j] = gelu(r[j]) for j < n.
void gelu_inplace(float* r, int64_t n);
// r[j] *= gelu'(pre[j]) for j < n: backward through GELU given the pre-activation.
void dgelu_mul_inplace(float* r, const float* pre, int64_t n);

}  // namespace qmesh
