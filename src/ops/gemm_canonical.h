// GemmArgs canonicalized into the one plain struct that the backends read: every check done,
// the copy of each operand chosen, and the column-major view that cuBLASLt takes.
#pragma once

#include <compare>
#include <cstdint>

#include "qmesh/ops/gemm.h"

namespace qmesh::detail {

enum class GemmBackend : uint8_t { kHost, kCublasLt };

// An operand as stored: a row-major rows × cols matrix (leading dimension cols) that holds
// op(A) [M, K] (k_contiguous) or its transpose [K, M] for A, and op(B)ᵀ [N, K] (k_contiguous)
// or op(B) [K, N] for B.
struct GemmMatrix {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  bool k_contiguous = true;
  const float* scale_inv = nullptr;  // FP8 only: dequantization factor, on the GEMM's device
};

// cuBLASLt computes column-major D' [m', n'] = op(A') · op(B'). A row-major D [M, N] is the
// column-major D' = Dᵀ [N, M], and Dᵀ = op(B)ᵀ · op(A)ᵀ, so A' is our B and B' is our A:
// m' = N, n' = M, k' = K. A row-major matrix with leading dimension ld is the column-major
// transpose with the same ld, hence transa' = T exactly when B is stored [N, K].
struct ColumnMajorGemm {
  bool trans_a = true;   // op on A' (our B): true for the TN form
  bool trans_b = false;  // op on B' (our A): false for the TN form
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldd = 0;

  auto operator<=>(const ColumnMajorGemm&) const = default;
};

struct CanonicalGemm {
  GemmBackend backend = GemmBackend::kHost;
  Device device;
  int64_t m = 0, n = 0, k = 0;
  GemmMatrix a;
  GemmMatrix b;
  ColumnMajorGemm cm;

  void* d = nullptr;  // [M, N] row-major, leading dimension N
  DType d_dtype = DType::kFloat32;
  float* d_scale = nullptr;
  float* d_amax = nullptr;
  float alpha = 1.0f;
  float beta = 0.0f;  // 1 for GemmOutputMode::kAccumulate

  GemmEpilogue epilogue = GemmEpilogue::kNone;
  void* bias = nullptr;  // [N] input, or [M] output for kBiasGrad
  DType bias_dtype = DType::kFloat32;
  void* aux = nullptr;  // [M, N], leading dimension N
  DType aux_dtype = DType::kFloat32;
  GemmAccumulation accumulation = GemmAccumulation::kFast;

  bool fp8_inputs() const { return is_fp8(a.dtype); }
};

// Checks `args` and returns the canonical form. Throws qmesh::Error naming the argument, the
// expected and the actual value. The device's availability is checked last.
CanonicalGemm canonicalize(const GemmArgs& args);

// The FP8 GEMM on CUDA needs every leading dimension to be a multiple of this (elements).
inline constexpr int64_t kCublasLtFp8Alignment = 16;

// cuBLASLt 13.1 refuses to launch an FP8 GEMM whose scale pointers are not aligned to this
// (bytes; docs/design/gemm.md): the CUDA backend stages such scalars.
inline constexpr uint32_t kCublasLtScalarAlignment = 16;

}  // namespace qmesh::detail
