// Bit-exact FP8 conversions on the host (OCP E4M3 "e4m3fn" and E5M2).
//
// Encoding rounds to nearest-even and saturates like CUDA's
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...): finite overflow and +-inf become +-max,
// every NaN becomes the canonical code 0x7F (sign dropped, as CUDA's conversion does).
// The scalar functions are branch-free arithmetic so that loops over them vectorize; they
// are the reference that the CUDA kernels are tested against.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "qmesh/detail/select.h"
#include "qmesh/dtype.h"
#include "qmesh/export.h"

namespace qmesh {

inline constexpr float kE4M3Max = 448.0f;
inline constexpr float kE5M2Max = 57344.0f;

// Largest finite value of an FP8 dtype (Error for a non-FP8 dtype).
QMESH_API float fp8_max(DType fp8);

namespace detail {

// One FP8 format: mantissa bits and exponent bias fix everything else.
template <int kMantissaBits, int kBias>
struct Fp8Format {
  static constexpr int kDropBits = 23 - kMantissaBits;
  static constexpr uint32_t kRebias = uint32_t(127 - kBias) << 23;
  // Float bits of the smallest normal value 2^(1-bias).
  static constexpr uint32_t kMinNormalBits = uint32_t(128 - kBias) << 23;
  // 2^(bias-1+mantissa): multiplying a subnormal by this gives its integer code.
  static constexpr float kSubnormalScale = float(1u << (kBias - 1 + kMantissaBits));
};
using E4M3 = Fp8Format<3, 7>;
using E5M2 = Fp8Format<2, 15>;

template <class F>
inline uint8_t encode_fp8(float x, uint32_t max_finite_bits, uint32_t max_code) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  const float absf = std::bit_cast<float>(abs);
  using detail::select_bits;
  // Normal range: rebias the exponent, then round the mantissa to nearest-even.
  const uint32_t rebased = abs - F::kRebias;
  const uint32_t normal =
      (rebased + ((1u << (F::kDropBits - 1)) - 1u) + ((rebased >> F::kDropBits) & 1u)) >>
      F::kDropBits;
  // Subnormal range: adding 2^23 rounds the scaled value to an integer, nearest-even.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(absf * F::kSubnormalScale + 8388608.0f) - 0x4B000000u;
  uint32_t code = select_bits(abs < F::kMinNormalBits, subnormal, normal);
  code = select_bits(abs > max_finite_bits, max_code, code);  // saturate, inf included
  return static_cast<uint8_t>(select_bits(abs > 0x7F800000u, 0x7Fu, code | sign));
}

}  // namespace detail

inline uint8_t float_to_e4m3(float x) {
  return detail::encode_fp8<detail::E4M3>(x, std::bit_cast<uint32_t>(kE4M3Max), 0x7Eu);
}
inline uint8_t float_to_e5m2(float x) {
  return detail::encode_fp8<detail::E5M2>(x, std::bit_cast<uint32_t>(kE5M2Max), 0x7Bu);
}

inline float e4m3_to_float(uint8_t code) {
  using F = detail::E4M3;
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t mag = code & 0x7Fu;
  const uint32_t subnormal = std::bit_cast<uint32_t>(float(mag) * (1.0f / F::kSubnormalScale));
  const uint32_t normal = (mag << F::kDropBits) + F::kRebias;
  uint32_t v = detail::select_bits((mag >> 3) == 0, subnormal, normal);
  v = detail::select_bits(mag == 0x7Fu, 0x7FC00000u, v);
  return std::bit_cast<float>(v | sign);
}

inline float e5m2_to_float(uint8_t code) {
  using F = detail::E5M2;
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t mag = code & 0x7Fu;
  const uint32_t subnormal = std::bit_cast<uint32_t>(float(mag) * (1.0f / F::kSubnormalScale));
  const uint32_t normal = (mag << F::kDropBits) + F::kRebias;
  uint32_t v = detail::select_bits((mag >> 2) == 0, subnormal, normal);
  v = detail::select_bits(mag >= 0x7Cu, detail::select_bits(mag == 0x7Cu, 0x7F800000u, 0x7FC00000u),
                          v);
  return std::bit_cast<float>(v | sign);
}

// Array conversions (vectorized; n may be 0). `fp8` selects E4M3 or E5M2 (Error otherwise).
// Encoding computes sat_rne(x * scale); decoding computes code * scale_inv.
QMESH_API void fp32_to_fp8(const float* in, uint8_t* out, size_t n, DType fp8, float scale);
QMESH_API void bf16_to_fp8(const uint16_t* in, uint8_t* out, size_t n, DType fp8, float scale);
QMESH_API void fp16_to_fp8(const uint16_t* in, uint8_t* out, size_t n, DType fp8, float scale);
QMESH_API void fp8_to_fp32(const uint8_t* in, float* out, size_t n, DType fp8, float scale_inv);

}  // namespace qmesh
