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

// max that propagates NaN: once a NaN is seen the result stays NaN.
QMESH_HOST_DEVICE inline float nan_max(float m, float a) { return (a > m || a != a) ? a : m; }

// Delayed scaling, steps 2-3 of NUMERICS.md: amax not > 0 (zero, negative, NaN) or not
// finite -> keep `old_scale`; else (fp8_max / amax) / 2^margin, where an infinite quotient
// (tiny amax) becomes FLT_MAX. `margin_factor` = 2^margin, computed once on the host.
QMESH_HOST_DEVICE inline float delayed_scale(float amax, float old_scale, float fp8_max,
                                             float margin_factor) {
  if (!(amax > 0.0f) || !(amax - amax == 0.0f)) return old_scale;
  const float quotient = fp8_max / amax;
  return quotient > FLT_MAX ? FLT_MAX : quotient / margin_factor;
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
// The fused delayed-scaling update of all n operands (one kernel on `stream`).
// history: fp32 [len, n]; scale, fp8_max: fp32 [n].
void update_scales(float* history, float* scale, const float* fp8_max, int n, int len,
                   bool most_recent, float margin_factor, Stream stream);
// *scale = current_scale_rule(*amax, ...) on the device, ordered on `stream`.
void set_current_scale(const float* amax, float* scale, float fp8_max, bool power_of_two,
                       float epsilon, Stream stream);
}  // namespace cuda

}  // namespace qmesh::detail
