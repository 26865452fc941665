// The NVFP4 numerics (docs/design/nvfp4.md, docs/numerics.md "NVFP4"), written once for the host
// twin (cpu/nvfp4_cast.cpp) and the CUDA kernels (cuda/nvfp4_cast.cu): every rounding is done
// on integer bits or by single fp32 operations that cannot be contracted, so both backends give
// the same bits by construction, stochastic rounding included.
#pragma once

#include <bit>
#include <cfloat>
#include <cstdint>

#include "core/splitmix64.h"
#include "scaling/scale_rules.h"  // QMESH_HOST_DEVICE

namespace qmesh::detail::nvfp4 {

inline constexpr int kBlock = 16;          // elements per E4M3 scale
inline constexpr float kE2M1Max = 6.0f;    // largest float4_e2m1fn
inline constexpr float kE4M3Max = 448.0f;  // largest float8_e4m3fn
inline constexpr uint32_t kE2M1MaxCode = 0x7;
inline constexpr uint32_t kE4M3MaxCode = 0x7E;

QMESH_HOST_DEVICE inline uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  return std::bit_cast<uint32_t>(x);
#endif
}
QMESH_HOST_DEVICE inline float float_of(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  return std::bit_cast<float>(b);
#endif
}

// The magnitude code (exponent and mantissa fields) of |x| rounded to a minifloat with
// kMant mantissa bits, smallest normal exponent kEmin and largest code kMaxCode: |x| (not NaN)
// is written as q * 2^(e - kMant), e = max(exponent of |x|, kEmin), and q is rounded to an
// integer: to nearest even when `stochastic` is false; else up with probability
// floor(rest * 2^32) / 2^32 (rest the fraction of a step cut off), the up-step taken when
// random < floor(rest * 2^32). Magnitudes past the largest (infinity too) saturate to kMaxCode.
template <int kMant, int kEmin, uint32_t kMaxCode>
QMESH_HOST_DEVICE inline uint32_t round_magnitude(float x, bool stochastic, uint32_t random) {
  const uint32_t b = bits_of(x) & 0x7FFFFFFFu;
  const int biased = int(b >> 23);
  if (biased == 0xFF) return kMaxCode;
  const uint32_t sig = biased == 0 ? (b & 0x7FFFFFu) : ((b & 0x7FFFFFu) | 0x800000u);
  const int e = biased == 0 ? -126 : biased - 127;
  const int e_eff = e < kEmin ? kEmin : e;
  const int shift = 23 - kMant + (e_eff - e);  // >= 23 - kMant > 0
  uint32_t q = shift >= 32 ? 0u : sig >> shift;
  const uint64_t rest = shift >= 32 ? sig : sig & ((uint32_t{1} << shift) - 1u);
  if (stochastic) {
    const uint64_t threshold = shift >= 56 ? 0u : (rest << 32) >> shift;
    q += uint64_t{random} < threshold ? 1u : 0u;
  } else if (shift <= 32) {
    const uint64_t half = uint64_t{1} << (shift - 1);
    q += (rest > half || (rest == half && (q & 1u))) ? 1u : 0u;
  }
  const uint32_t code = (uint32_t(e_eff - kEmin) << kMant) + q;
  return code < kMaxCode ? code : kMaxCode;
}

// float4_e2m1fn code of x (sign in bit 3), saturating to +-6; NaN encodes as +6 (0x7).
QMESH_HOST_DEVICE inline uint8_t encode_e2m1(float x, bool stochastic, uint32_t random) {
  if (x != x) return uint8_t(kE2M1MaxCode);
  const uint32_t sign = (bits_of(x) >> 31) << 3;
  return uint8_t(sign | round_magnitude<1, 0, kE2M1MaxCode>(x, stochastic, random));
}

// The value of a float4_e2m1fn code.
QMESH_HOST_DEVICE inline float decode_e2m1(uint8_t code) {
  const uint32_t m = code & 0x7u;
  // 0, 0.5 (subnormal), then (2 + mantissa) * 2^(exponent - 2).
  const float mag = m < 2 ? 0.5f * float(m) : float(2u + (m & 1u)) * float(1u << (m >> 1)) * 0.25f;
  return (code & 0x8u) ? -mag : mag;
}

// float8_e4m3fn code of a scale a >= 0 (not NaN): round to nearest even, saturating to 448.
QMESH_HOST_DEVICE inline uint8_t encode_e4m3_scale(float a) {
  return uint8_t(round_magnitude<3, -6, kE4M3MaxCode>(a, false, 0u));
}

// The value of a non-negative float8_e4m3fn code (not NaN).
QMESH_HOST_DEVICE inline float decode_e4m3_scale(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xFu, m = code & 0x7u;
  if (e == 0) return float(m) * 0x1p-9f;
  return float_of(((e + 120u) << 23) | (m << 20));
}

// The per-tensor encode scale from the copy's amax: (448 * 6) / amax, at most FLT_MAX; 1 when
// amax is 0, infinite or NaN.
QMESH_HOST_DEVICE inline float global_encode_scale(float amax) {
  if (!(amax > 0.0f) || !(amax <= FLT_MAX)) return 1.0f;
  const float s = (kE4M3Max * kE2M1Max) / amax;
  return s <= FLT_MAX ? s : FLT_MAX;
}

// The per-tensor decode scale a copy stores (scale_inv): 1 / global_encode, or NaN when the
// copy's amax is NaN or infinite, so that every decoded value and every GEMM product of a
// non-finite tensor is NaN (E2M1 holds no NaN or infinity; the codes alone would be finite).
QMESH_HOST_DEVICE inline float stored_decode_scale(float amax, float global_encode) {
  return amax <= FLT_MAX ? 1.0f / global_encode : float_of(0x7FC00000u);
}

// The E4M3 decode scale of a block: block_amax * (global_encode / 6), at most FLT_MAX (NaN and
// infinity included), rounded to E4M3 (saturating at 448).
QMESH_HOST_DEVICE inline uint8_t block_scale_code(float block_amax, float global_encode) {
  const float s = block_amax * (global_encode * (1.0f / kE2M1Max));
  return encode_e4m3_scale(s <= FLT_MAX ? s : FLT_MAX);
}

// The factor that takes the block's elements to E2M1: 1 / (decoded block scale * global
// decode scale), at most FLT_MAX (a zero block scale).
QMESH_HOST_DEVICE inline float block_encode_factor(uint8_t scale_code, float global_decode) {
  const float f = 1.0f / (decode_e4m3_scale(scale_code) * global_decode);
  return f <= FLT_MAX ? f : FLT_MAX;
}

// The 32 random bits of element `index` (row-major in its copy) of copy `copy` (0 rowwise, 1
// columnwise) for stochastic rounding with `seed`: a pure function, the same on every backend.
QMESH_HOST_DEVICE inline uint32_t rounding_bits(uint64_t seed, int copy, uint64_t index) {
  return uint32_t(splitmix64(seed ^ splitmix64(2u * index + uint64_t(copy))) >> 32);
}

// The random Hadamard transform of 16 values: out = (1/4) H diag(d) v, where H is the 16x16
// Sylvester Hadamard matrix (H[i][j] = (-1)^popcount(i & j)) and d[j] = -1 where bit j of
// `signs` is set, else 1. Each out[i] is the fp32 sum over j = 0..15 in order (from 0) of the
// exactly negated or kept v[j], times 0.25. `inverse` applies the transpose, diag(d) H / 4.
QMESH_HOST_DEVICE inline void hadamard16(const float (&v)[kBlock], uint32_t signs, bool inverse,
                                         float (&out)[kBlock]) {
  for (int i = 0; i < kBlock; ++i) {
    float acc = 0.0f;
    for (int j = 0; j < kBlock; ++j) {
      uint32_t parity = uint32_t(i & j);
      parity ^= parity >> 2;
      parity ^= parity >> 1;
      const uint32_t negative = (parity ^ (signs >> (inverse ? i : j))) & 1u;
      acc += negative ? -v[j] : v[j];
    }
    out[i] = acc * 0.25f;
  }
}

}  // namespace qmesh::detail::nvfp4
