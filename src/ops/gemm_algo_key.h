// The keys of a cuBLASLt GEMM: the problem (everything but the pointers' values), under which
// a plan is kept and re-pointed, and the text key under which a chosen algorithm is cached
// (in memory and in the autotune file). Host code, so that both are unit-tested on any
// machine.
#pragma once

#include <array>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "ops/gemm_canonical.h"
#include "qmesh/export.h"

namespace qmesh::detail {

// The largest power of two up to 256 that divides the address (256 for nullptr).
QMESH_API uint32_t pointer_alignment(const void* p);

// Byte alignments of cuBLASLt's A', B', C and D (A' is our B, B' our A; C is D, or none for
// an FP8 D), in the order of CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_{A,B,C,D}_BYTES.
QMESH_API std::array<uint32_t, 4> gemm_operand_alignments(const CanonicalGemm& c);

// A GEMM without its pointers: what selects the cuBLASLt algorithm and what a plan's
// descriptors hold. GEMMs with equal problems share one plan; only the pointers differ.
struct QMESH_API GemmProblem {
  int device = 0;
  ColumnMajorGemm cm;                            // shapes, transposes, leading dimensions
  DType a = DType::kFloat32;                     // cuBLASLt's A' (our B)
  DType b = DType::kFloat32;                     // cuBLASLt's B' (our A)
  GemmScaling a_scaling = GemmScaling::kTensor;  // A' scale mode (our B's)
  GemmScaling b_scaling = GemmScaling::kTensor;  // B' scale mode (our A's)
  DType d = DType::kFloat32;
  float beta = 0.0f;
  bool device_alpha_beta = false;  // alpha and beta read from device memory
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  DType bias = DType::kFloat32;  // the bias's dtype (kFloat32 without a bias)
  DType aux = DType::kFloat32;   // the aux's dtype (kFloat32 without an aux)
  GemmAccumulation accumulation = GemmAccumulation::kFast;
  bool amax_d = false;                   // amax of D requested
  std::array<uint32_t, 6> alignments{};  // A', B', C, D, bias, aux (pointer_alignment)
  // Bit i set: scalar i (A' scale_inv, B' scale_inv, D scale, D amax) is not 16-byte aligned
  // and is staged at each launch (gemm_cublaslt.cpp).
  uint32_t staged_scalars = 0;

  auto operator<=>(const GemmProblem&) const = default;
};

// The problem of `c` on its device.
QMESH_API GemmProblem gemm_problem(const CanonicalGemm& c);

// One tab-free line: device name, library version, shapes, layouts, dtypes, scale modes, beta,
// epilogue with bias and aux dtypes, accumulation, whether amax of D is requested, and the
// alignments of A', B', C, D, bias and aux (then "|batch<count>" for a strided batch, and
// "|alpha device" when alpha and beta are read from device memory): gemm_problem(c) but the device
// index and the staging.
QMESH_API std::string gemm_algo_key(const CanonicalGemm& c, std::string_view device_name,
                                    size_t library_version);

}  // namespace qmesh::detail
