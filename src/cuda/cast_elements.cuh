// Element access shared by the CUDA cast kernels (cuda/cast.cu, cuda/block_cast.cu,
// cuda/norm.cu): widening loads, rounding stores, the bounded 16-byte store of codes, the host
// dispatch that picks the kernel instance for an input dtype and FP8 format, and the
// deterministic sum of per-tile column sums.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "ops/cast_activation.h"  // abs_bits
#include "qmesh/dtype.h"
#include "qmesh/error.h"

namespace qmesh::detail::cuda {

// The two 16-bit inputs are told apart by a tag type, both stored as uint16_t.
struct Bf16 {
  uint16_t bits;
};
struct Fp16 {
  uint16_t bits;
};

template <class T>
__device__ __forceinline__ float load_float(T x);
template <>
__device__ __forceinline__ float load_float<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ float load_float<Bf16>(Bf16 x) {
  return __uint_as_float(uint32_t(x.bits) << 16);
}
template <>
__device__ __forceinline__ float load_float<Fp16>(Fp16 x) {
  return __half2float(__ushort_as_half(x.bits));
}

template <class T>
__device__ __forceinline__ void store_float(T* out, float x);
template <>
__device__ __forceinline__ void store_float<float>(float* out, float x) {
  *out = x;
}
template <>
__device__ __forceinline__ void store_float<Bf16>(Bf16* out, float x) {
  out->bits = __bfloat16_as_ushort(__float2bfloat16_rn(x));
}
template <>
__device__ __forceinline__ void store_float<Fp16>(Fp16* out, float x) {
  out->bits = __half_as_ushort(__float2half_rn(x));
}

// The value of an FP8 code, exactly.
template <__nv_fp8_interpretation_t kFmt>
__device__ __forceinline__ float decode_fp8(uint8_t code) {
  return __half2float(__half(__nv_cvt_fp8_to_halfraw(code, kFmt)));
}

// dbias[c] = ((0 + partials[0, c]) + partials[1, c]) + ... for fp32 partial column sums
// [row_tiles, cols] (one row per tile row of a cast kernel): deterministic. Enqueued on
// `stream` on the current device (defined in cuda/cast.cu).
void sum_tile_partials(const float* partials, int64_t row_tiles, int64_t cols, float* dbias,
                       cudaStream_t stream);

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// FP8 codes per 16-byte store.
constexpr int kCodeVec = 16;

// Stores the first min(kCodeVec, n - i) codes at out[i]: one 16-byte store where `vec` (out
// 16-byte aligned, i and n multiples of kCodeVec) and all of them are in range.
__device__ __forceinline__ void store_vec(uint8_t* out, int64_t i, int64_t n, bool vec,
                                          const uint8_t (&codes)[kCodeVec]) {
  if (vec && i + kCodeVec <= n) {
    *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(codes);
  } else {
#pragma unroll
    for (int k = 0; k < kCodeVec; ++k)
      if (i + k < n) out[i + k] = codes[k];
  }
}

template <class T>
struct TypeTag {
  using type = T;
};
template <__nv_fp8_interpretation_t kFmt>
struct FmtTag {
  static constexpr __nv_fp8_interpretation_t value = kFmt;
};

// Calls f(TypeTag<T>, FmtTag<fmt>) for the dtype pair (wide: fp32, bf16 or fp16).
template <class F>
void dispatch_dtypes(DType wide, DType fp8, F&& f) {
  auto with_type = [&](auto type) {
    if (fp8 == DType::kFloat8E5M2)
      f(type, FmtTag<__NV_E5M2>{});
    else
      f(type, FmtTag<__NV_E4M3>{});
  };
  switch (wide) {
    case DType::kFloat32:
      return with_type(TypeTag<float>{});
    case DType::kBFloat16:
      return with_type(TypeTag<Bf16>{});
    case DType::kFloat16:
      return with_type(TypeTag<Fp16>{});
    default:
      QMESH_THROW_KIND(ErrorKind::kUnsupported, "CUDA cast: unsupported wide dtype ",
                       dtype_name(wide));
  }
}

}  // namespace qmesh::detail::cuda
