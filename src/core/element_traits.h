// Element loaders and FP8 encoders as types, so that one templated loop serves every input
// dtype and FP8 format (internal; shared by the array conversions and the CPU cast ops).
#pragma once

#include <cstdint>

#include "qmesh/float16.h"
#include "qmesh/fp8.h"

namespace qmesh::detail {

struct LoadFp32 {
  using type = float;
  static float apply(float x) { return x; }
};
struct LoadBf16 {
  using type = uint16_t;
  static float apply(uint16_t x) { return bf16_to_float(x); }
};
struct LoadFp16 {
  using type = uint16_t;
  static float apply(uint16_t x) { return fp16_to_float(x); }
};
struct EncodeE4M3 {
  static uint8_t apply(float x) { return float_to_e4m3(x); }
};
struct EncodeE5M2 {
  static uint8_t apply(float x) { return float_to_e5m2(x); }
};

}  // namespace qmesh::detail
