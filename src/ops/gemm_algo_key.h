// The key under which a chosen cuBLASLt algorithm is cached (in memory and in the autotune
// file): everything that can change the heuristic's or the tuner's choice. Host code, so
// that the key is unit-tested on any machine.
#pragma once

#include <array>
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

// One tab-free line: device name, library version, shapes, layouts, dtypes, beta, epilogue
// with bias and aux dtypes, accumulation, whether amax of D is requested, and the alignments
// of A', B', C, D, bias and aux.
QMESH_API std::string gemm_algo_key(const CanonicalGemm& c, std::string_view device_name,
                                    size_t library_version);

}  // namespace qmesh::detail
