// GemmArgs canonicalized into the one plain struct that the backends read: every check done,
// the copy of each operand chosen, and the column-major view that cuBLASLt takes.
#pragma once

#include <compare>
#include <cstdint>

#include "qmesh/ops/gemm.h"

namespace qmesh::detail {

enum class GemmBackend : uint8_t { kHost, kCublasLt };

// How an operand's scale_inv is applied (cuBLASLt's A/B scale modes).
enum class GemmScaling : uint8_t {
  kTensor,        // one fp32 scalar (per-tensor FP8), or none (plain operands)
  kBlock1x128,    // one fp32 per 128 consecutive elements along K (VEC128_32F)
  kBlock128x128,  // one fp32 per 128x128 tile (BLK128x128_32F)
  kVec32Ue8m0,    // MXFP8, CUDA only: one E8M0 byte per 32 elements along K, swizzled
                  // (VEC32_UE8M0; ops/gemm_native_microscaled.h)
  kVec16Ue4m3     // NVFP4, CUDA only: one E4M3 byte per 16 elements along K, swizzled
                  // (VEC16_UE4M3; ops/gemm_native_microscaled.h)
};

// An operand as stored: a row-major rows × cols matrix (leading dimension cols) that holds
// op(A) [M, K] (k_contiguous) or its transpose [K, M] for A, and op(B)ᵀ [N, K] (k_contiguous)
// or op(B) [K, N] for B. rows and cols count elements (fp4e2m1x2: two per byte).
struct GemmMatrix {
  const void* data = nullptr;
  DType dtype = DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  bool k_contiguous = true;
  // FP8 only, on the GEMM's device: the dequantization factor (kTensor), or the block scale
  // tensor of the stored copy in the layout of qmesh/block_quantized_tensor.h (always
  // k_contiguous then: its blocks run along K); kVec32Ue8m0 / kVec16Ue4m3: the address of the
  // swizzled E8M0 / E4M3 scales (bytes, not floats: cuBLASLt takes every scale pointer
  // untyped).
  const float* scale_inv = nullptr;
  GemmScaling scaling = GemmScaling::kTensor;

  bool block_scaled() const { return scaling != GemmScaling::kTensor; }
  // Block-scaled: the scale_inv of stored element (r, c).
  float block_scale_inv(int64_t r, int64_t c) const;
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
  // Strided batch: the element count and each matrix's element stride (elements; 0 when
  // batch is 1), set on every layout as CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT and
  // CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET (C shares D's).
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_d = 0;

  auto operator<=>(const ColumnMajorGemm&) const = default;
};

struct CanonicalGemm {
  GemmBackend backend = GemmBackend::kHost;
  Device device;
  int64_t m = 0, n = 0, k = 0;
  int64_t batch = 1;  // GemmArgs::batch: a, b and d hold that many matrices, one after another
  GemmMatrix a;       // rows and cols: one batch element's
  GemmMatrix b;
  ColumnMajorGemm cm;

  void* d = nullptr;  // [M, N] row-major, leading dimension N
  DType d_dtype = DType::kFloat32;
  float* d_scale = nullptr;
  float* d_amax = nullptr;
  float alpha = 1.0f;
  float beta = 0.0f;  // 1 for GemmOutputMode::kAccumulate
  // CUDA only: alpha at [0] and beta at [1] as fp32 in the device's memory, which cuBLASLt
  // reads at each launch (CUBLASLT_POINTER_MODE_DEVICE) instead of alpha and beta above;
  // the native NVFP4 GEMM's, whose alpha holds the operands' per-tensor decode scales.
  const float* device_alpha_beta = nullptr;

  GemmEpilogue epilogue = GemmEpilogue::kNone;
  void* bias = nullptr;  // [N] input, or [M] output for kBiasGrad
  DType bias_dtype = DType::kFloat32;
  void* aux = nullptr;  // [M, N], leading dimension N
  DType aux_dtype = DType::kFloat32;
  GemmAccumulation accumulation = GemmAccumulation::kFast;

  bool fp8_inputs() const { return is_fp8(a.dtype); }
  bool fp4_inputs() const { return a.dtype == DType::kFloat4E2M1x2; }
  // FP8 or FP4 codes, which cuBLASLt scales through A/B_SCALE_POINTER.
  bool quantized_inputs() const { return fp8_inputs() || fp4_inputs(); }
  bool block_scaled() const { return a.block_scaled(); }
};

// The rules of GemmArgs::batch that need no shapes (batch >= 1; with batch > 1: per-tensor
// FP8 or plain operands, epilogue kNone, kBias or kGelu, no d_amax). canonicalize() checks
// them; the microscaled paths, which canonicalize other arguments, call this first.
void check_batch(const GemmArgs& args);

// Element i of a batched GEMM (c.batch > 1) as a GEMM of its own: a, b and d moved to the
// element's matrices, batch 1.
CanonicalGemm batch_element(const CanonicalGemm& c, int64_t i);

// Checks `args` and returns the canonical form. Throws qmesh::Error naming the argument, the
// expected and the actual value. The device's availability is checked last.
CanonicalGemm canonicalize(const GemmArgs& args);

// The FP8 GEMM on CUDA needs every leading dimension to be a multiple of this (elements).
inline constexpr int64_t kCublasLtFp8Alignment = 16;

// cuBLASLt 13.1 refuses to launch an FP8 GEMM whose scale pointers are not aligned to this
// (bytes; docs/design/gemm.md): the CUDA backend stages such scalars.
inline constexpr uint32_t kCublasLtScalarAlignment = 16;

}  // namespace qmesh::detail
