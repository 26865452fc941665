// The internal description of one norm_forward call (ops/norm_forward.h) that both backends
// execute, and the per-element arithmetic they share (cpu/norm.cpp, cuda/norm.cu): one
// definition, so that y, the codes and the amax agree bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "cpu/gelu.h"
#include "qmesh/dtype.h"

namespace qmesh::detail {

// The lanes a row's sums are split over: the CUDA kernel's threads per row. The host adds in
// the same order (cpu/norm.cpp).
constexpr int kNormLanes = 256;

// Pointers are null where nothing is read or written. Arguments are checked by the caller.
struct NormJob {
  const void* x = nullptr;  // [rows, cols] of x_dtype
  DType x_dtype = DType::kFloat32;
  const float* gamma = nullptr;
  const float* beta = nullptr;  // null: RMSNorm
  float eps = 1e-5f;
  bool zero_centered_gamma = false;
  int64_t rows = 0;
  int64_t cols = 0;
  DType y_dtype = DType::kFloat32;
  void* y = nullptr;
  DType fp8 = DType::kFloat8E4M3;
  uint8_t* out = nullptr;    // rowwise codes [rows, cols]
  uint8_t* out_t = nullptr;  // columnwise codes [cols, rows]
  const float* scale = nullptr;
  float* scale_inv = nullptr;  // written as 1 / *scale when out is set
  float* amax = nullptr;       // running max with out, else replaced
  float* mean = nullptr;
  float* rstd = nullptr;
};

// The normalised value of x (before rounding to y_dtype): g is gamma, already + 1 for a
// zero-centred gamma; b is beta (0 and unused for RMSNorm, whose mean is 0).
QMESH_HOST_DEVICE inline float normalize(float x, float mean, float rstd, float g, float b,
                                         bool rms) {
  using namespace gelu_detail;
  const float v = mul(mul(rms ? x : sub(x, mean), rstd), g);
  return rms ? v : add(v, b);
}

// 1 / sqrt(sum_sq / cols + eps), each step rounded to nearest (IEEE) on both backends.
QMESH_HOST_DEVICE inline float norm_rstd(float sum_sq, int64_t cols, float eps) {
  using namespace gelu_detail;
  const float v = add(div(sum_sq, float(cols)), eps);
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(1.0f, __fsqrt_rn(v));
#else
  return 1.0f / std::sqrt(v);
#endif
}

// y, mean, rstd and the amax of a NaN row: the canonical NaN on both backends.
using gelu_detail::canonical_nan;

}  // namespace qmesh::detail
