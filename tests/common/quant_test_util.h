// Helpers shared by the quantization tests: random wide-float inputs and element access.
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "qmesh/tensor.h"

namespace qmesh::test {

// Element i of a host fp32/bf16/fp16 tensor as a float.
inline float wide_at(const TensorView& t, int64_t i) {
  switch (t.dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(t.data)[i];
    case DType::kBFloat16:
      return bf16_to_float(static_cast<const uint16_t*>(t.data)[i]);
    default:
      return fp16_to_float(static_cast<const uint16_t*>(t.data)[i]);
  }
}

inline void set_wide(const TensorView& t, int64_t i, float v) {
  switch (t.dtype) {
    case DType::kFloat32:
      static_cast<float*>(t.data)[i] = v;
      break;
    case DType::kBFloat16:
      static_cast<uint16_t*>(t.data)[i] = float_to_bf16(v);
      break;
    default:
      static_cast<uint16_t*>(t.data)[i] = float_to_fp16(v);
      break;
  }
}

// Random values spanning many binades (|x| from ~2^-12 to ~2^6, both signs, some zeros).
inline Tensor random_wide(DType dtype, Shape shape, uint32_t seed) {
  Tensor t(dtype, std::move(shape));
  std::mt19937 rng(seed);
  std::normal_distribution<float> mantissa(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-12, 6);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float v = i % 97 == 0 ? 0.0f : std::ldexp(mantissa(rng), exponent(rng));
    set_wide(t, i, v);
  }
  return t;
}

// The reference FP8 encoder/decoder: the scalar conversions of qmesh/fp8.h, verified against
// CUDA's own conversions for every float32 input (numerics_exhaustive_test).
inline uint8_t encode_ref(DType fp8, float x) {
  return fp8 == DType::kFloat8E4M3 ? float_to_e4m3(x) : float_to_e5m2(x);
}
inline float decode_ref(DType fp8, uint8_t code) {
  return fp8 == DType::kFloat8E4M3 ? e4m3_to_float(code) : e5m2_to_float(code);
}

// The values of a wide tensor (fp32, bf16, fp16) as floats, row-major.
inline std::vector<float> widened(const TensorView& x) {
  std::vector<float> v(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) v[static_cast<size_t>(i)] = wide_at(x, i);
  return v;
}

// The transpose [cols, rows] of a row-major [rows, cols] matrix.
inline std::vector<float> transposed(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      t[static_cast<size_t>(c * rows + r)] = v[static_cast<size_t>(r * cols + c)];
  return t;
}

inline bool same_bits(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return x == y;
}

}  // namespace qmesh::test
