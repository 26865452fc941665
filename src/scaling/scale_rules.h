// The per-tensor scaling rules, written once for the host and the CUDA kernels so that both
// backends evaluate the same fp32 operations in the same order (bit-identical scales).
#pragma once

#include <bit>
#include <cfloat>
#include <cstdint>

#include "qmesh/stream.h"

#if defined(__CUDACC__)
#define QMESH_HOST_DEVICE __host__ __device__
#else
#define QMESH_HOST_DEVICE
#endif

namespace qmesh::detail {

// max that skips NaN (fmaxf's rule, which TransformerEngine's update kernel uses over the amax
// window): a NaN amax in the history never decides the scale.
QMESH_HOST_DEVICE inline float skip_nan_max(float m, float a) { return (a > m || m != m) ? a : m; }

// Delayed scaling, docs/numerics.md "Delayed scaling" (TransformerEngine's rule): amax not > 0
// (zero, negative, NaN) or not finite -> keep `old_scale`; else scaled_max / amax, where
// scaled_max = fp8_max * 2^-margin (delayed_scaled_max) and an infinite quotient (tiny amax)
// becomes FLT_MAX.
QMESH_HOST_DEVICE inline float delayed_scale(float amax, float old_scale, float scaled_max) {
  if (!(amax > 0.0f) || !(amax - amax == 0.0f)) return old_scale;
  const float quotient = scaled_max / amax;
  return quotient > FLT_MAX ? FLT_MAX : quotient;
}

// fp8_max * 2^-margin, the numerator of delayed_scale; `margin_scale` = 2^-margin, computed
// once on the host.
QMESH_HOST_DEVICE inline float delayed_scaled_max(float fp8_max, float margin_scale) {
  return fp8_max * margin_scale;
}

// Current scaling (TransformerEngine's compute_scale_from_amax): see
// qmesh/scaling/current_scaling.h.
QMESH_HOST_DEVICE inline float current_scale_rule(float amax, float fp8_max, bool power_of_two,
                                                  float epsilon) {
  const float a = amax < epsilon ? epsilon : amax;
  if (a == 0.0f || a > FLT_MAX || a != a) return 1.0f;
  float s = fp8_max / a;
  s = s > FLT_MAX ? FLT_MAX : s;
  if (power_of_two) {
#if defined(__CUDA_ARCH__)
    s = __uint_as_float(__float_as_uint(s) & 0xFF800000u);
#else
    s = std::bit_cast<float>(std::bit_cast<uint32_t>(s) & 0xFF800000u);
#endif
  }
  return s;
}

namespace cuda {
// The fused delayed-scaling update of all n operands (one kernel on CUDA device `device`,
// ordered on `stream`). history: fp32 [len, n]; fp8_max: fp32 [n]; operand i's scale:
// scale[i * scale_stride].
void update_scales(int device, float* history, float* scale, int64_t scale_stride,
                   const float* fp8_max, int n, int len, bool most_recent, float margin_scale,
                   Stream stream);
// *scale = current_scale_rule(*amax, ...) on CUDA device `device`, ordered on `stream`.
void set_current_scale(int device, const float* amax, float* scale, float fp8_max,
                       bool power_of_two, float epsilon, Stream stream);
}  // namespace cuda

}  // namespace qmesh::detail
