// The MXFP8 scale rule (docs/design/mxfp8.md "Scale rule"), written once for the host and the
// CUDA kernels so that both backends derive the same E8M0 byte and the same multiplier.
#pragma once

#include <cstdint>

#include "scaling/scale_rules.h"

namespace qmesh::detail {

#if defined(__CUDA_ARCH__)
QMESH_HOST_DEVICE inline uint32_t mx_float_bits(float x) { return __float_as_uint(x); }
QMESH_HOST_DEVICE inline float mx_bits_float(uint32_t b) { return __uint_as_float(b); }
#else
inline uint32_t mx_float_bits(float x) { return std::bit_cast<uint32_t>(x); }
inline float mx_bits_float(uint32_t b) { return std::bit_cast<float>(b); }
#endif

inline constexpr uint8_t kE8M0Nan = 0xFF;

// The E8M0 byte of a block of amax `amax` (>= 0 or NaN) for elements of largest value
// `scaled_max` (fp8_max * 2^-margin): q = amax / scaled_max in fp32, rounded UP to a power of
// two 2^(byte - 127) so that no element saturates. NaN -> 0xFF; q = +inf -> 0xFE (the largest
// power); q <= 2^-127 (a zero block included) -> 0 (the smallest).
QMESH_HOST_DEVICE inline uint8_t mx_scale_byte(float amax, float scaled_max) {
  const float q = amax / scaled_max;
  if (q != q) return kE8M0Nan;
  const uint32_t bits = mx_float_bits(q);
  uint32_t exponent = (bits >> 23) & 0xFFu;
  const uint32_t mantissa = bits & 0x7FFFFFu;
  if (exponent == 0xFFu) return 0xFE;
  if (mantissa > 0 && exponent != 0xFEu && !(exponent == 0 && mantissa <= 0x400000u)) ++exponent;
  return static_cast<uint8_t>(exponent);
}

// 2^(byte - 127), the dequantization multiplier (scale_inv); NaN for 0xFF.
QMESH_HOST_DEVICE inline float mx_scale_inv(uint8_t byte) {
  if (byte == kE8M0Nan) return mx_bits_float(0x7FC00000u);
  return byte == 0 ? mx_bits_float(0x00400000u) : mx_bits_float(uint32_t(byte) << 23);
}

// 2^(127 - byte), the quantization multiplier (exactly 1 / mx_scale_inv); 1 for 0xFF (a NaN
// block's codes are then sat_rne(x); the NaN scale decodes the block to NaN anyway).
QMESH_HOST_DEVICE inline float mx_scale(uint8_t byte) {
  if (byte == kE8M0Nan) return 1.0f;
  return byte == 254 ? mx_bits_float(0x00400000u) : mx_bits_float(uint32_t(254 - byte) << 23);
}

}  // namespace qmesh::detail
