// Bit-exact 16-bit float conversions on the host: bfloat16 and IEEE binary16 (fp16).
// fp32 -> 16-bit rounds to nearest-even; overflow becomes inf (no saturation, as in CUDA's
// __float2bfloat16_rn / __float2half_rn); NaN stays NaN (quiet).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "qmesh/detail/select.h"
#include "qmesh/export.h"

namespace qmesh {

inline uint16_t float_to_bf16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const bool nan = (bits & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(detail::select_bits(nan, (bits >> 16) | 0x40u, rounded));
}

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

inline uint16_t float_to_fp16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  const float absf = std::bit_cast<float>(abs);
  const uint32_t rebased = abs - (112u << 23);
  uint32_t normal = (rebased + 0xFFFu + ((rebased >> 13) & 1u)) >> 13;
  normal = detail::select_bits(normal > 0x7C00u, 0x7C00u, normal);  // overflow -> inf
  const uint32_t subnormal = std::bit_cast<uint32_t>(absf * 16777216.0f + 8388608.0f) - 0x4B000000u;
  uint32_t code = detail::select_bits(abs < (113u << 23), subnormal, normal);
  code = detail::select_bits(abs > 0x7F800000u, 0x7E00u | ((abs >> 13) & 0x3FFu), code);  // qNaN
  return static_cast<uint16_t>(code | sign);
}

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t mag = h & 0x7FFFu;
  const uint32_t subnormal = std::bit_cast<uint32_t>(float(mag) * (1.0f / 16777216.0f));
  const uint32_t normal = (mag << 13) + (112u << 23);
  const uint32_t special = 0x7F800000u | ((mag & 0x3FFu) << 13);
  uint32_t v = detail::select_bits((mag >> 10) == 0, subnormal, normal);
  v = detail::select_bits((mag >> 10) == 0x1Fu, special, v);
  return std::bit_cast<float>(v | sign);
}

// Array conversions (vectorized; n may be 0).
QMESH_API void fp32_to_bf16(const float* in, uint16_t* out, size_t n);
QMESH_API void bf16_to_fp32(const uint16_t* in, float* out, size_t n);
QMESH_API void fp32_to_fp16(const float* in, uint16_t* out, size_t n);
QMESH_API void fp16_to_fp32(const uint16_t* in, float* out, size_t n);

}  // namespace qmesh
