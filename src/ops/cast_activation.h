// The value a fused cast quantizes (CastActivation in ops/cast_job.h), one definition for the
// host (cpu/cast.cpp) and CUDA (cuda/cast.cu) backends so that their codes and amax agree bit
// for bit. A NaN result is the canonical NaN 0x7FFFFFFF on both (the device's arithmetic
// produces it, the host's would carry the input's payload), so the amax of a NaN is one value.
#pragma once

#include <bit>
#include <cstdint>

#include "cpu/gelu.h"
#include "ops/cast_job.h"

namespace qmesh::detail {

template <CastActivation kAct>
QMESH_HOST_DEVICE inline float activate(float x, [[maybe_unused]] float pre) {
  if constexpr (kAct == CastActivation::kNone) {
    return x;
  } else {
    return gelu_detail::canonical_nan(
        kAct == CastActivation::kGelu ? gelu(x) : gelu_detail::mul(x, dgelu(pre)));
  }
}

// |x| as bits: non-negative floats order like their bit patterns and every NaN sorts above
// +inf (the NaN-propagating amax of ops/amax.h). Host and device.
QMESH_HOST_DEVICE inline uint32_t abs_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x) & 0x7FFFFFFFu;
#else
  return std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu;
#endif
}

// An upper bound of |activate<kAct>(x, pre)| as the bits of a non-negative float (which order
// like the floats), or 0xFFFFFFFF where none is given: for a non-finite x, and for kDgelu a
// pre that is not finite or beyond 2^32 (where gelu' can overflow into inf · 0 = NaN). A pass
// that wants only max |activate| may skip every element whose bound is at most a maximum
// already found (the amax kernel of cuda/cast.cu); the maximum stays the same bit for bit.
//   kNone:  |x|.
//   kGelu:  max(|x|, 2^-124). gelu(x) = fl(fl(x/2) · s) with s = fl(1 + tanh_approx) in
//           [0, 2] (tanh_approx = 1 - 2 / (e + 1) with e > 0). x/2 is exact for
//           |x| >= 2^-125, so |gelu(x)| <= fl(|x| / 2 · 2) = |x|; below, |fl(x/2)| <= |x| and
//           |gelu(x)| <= fl(2^-125 · 2) = 2^-124 (rounding is monotonic).
//   kDgelu: fl(1.25 · |x|): |gelu'(pre)| <= 1.13 for |pre| <= 2^32 (gelu' itself peaks at
//           1.129; over every fp32 pre with 2^-4 <= |pre| <= 16 the computed one peaks at
//           1.12899; past |pre| = 6 the computed tanh is exactly +-1 and the second term 0; the
//           unit test checks every bf16 and fp16 pre and fp32 samples), so
//           |fl(x · gelu'(pre))| <= fl(1.25 · |x|) for finite x and pre.
template <CastActivation kAct>
QMESH_HOST_DEVICE inline uint32_t activation_bound(float x, [[maybe_unused]] float pre) {
  constexpr uint32_t kInfBits = 0x7F800000u;
  constexpr uint32_t kUnknown = 0xFFFFFFFFu;
  const uint32_t ax = abs_bits(x);
  if constexpr (kAct == CastActivation::kNone) {
    return ax;
  } else if constexpr (kAct == CastActivation::kGelu) {
    constexpr uint32_t kTinyBits = 3u << 23;  // 2^-124
    return ax >= kInfBits ? kUnknown : (ax > kTinyBits ? ax : kTinyBits);
  } else {
    constexpr uint32_t kPreLimitBits = (127u + 32u) << 23;  // 2^32
    if (ax >= kInfBits || abs_bits(pre) > kPreLimitBits) return kUnknown;
    return abs_bits(gelu_detail::mul(1.25f, gelu_detail::from_bits(ax)));
  }
}

}  // namespace qmesh::detail
