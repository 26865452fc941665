// The host GEMM backend: FP8/bf16/fp16 operands are widened to fp32 panel by panel and
// multiplied by OpenBLAS sgemm; the epilogue runs in one vectorized pass over D.
#pragma once

#include <cstddef>

#include "ops/gemm_canonical.h"

namespace qmesh::detail {

// Host scratch bytes that host_gemm uses for `c` (0 when no operand needs widening, D is
// fp32 and there is nothing to reduce).
size_t host_gemm_workspace_size(const CanonicalGemm& c);

// Computes the GEMM described by `c` (host tensors) before returning. `workspace` is nullptr
// (a per-thread cached buffer is used) or `workspace_bytes` of host memory; Error if that is
// less than the GEMM needs now (the panel budget or QMESH_CPU_THREADS changed since
// the size was asked).
void host_gemm(const CanonicalGemm& c, void* workspace, size_t workspace_bytes);

}  // namespace qmesh::detail
