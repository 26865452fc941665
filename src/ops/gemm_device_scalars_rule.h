// The alpha of the native NVFP4 GEMM (docs/design/gemm.md "Native microscaled GEMMs"): the
// user's alpha times both operands' per-tensor fp32 decode scales, which cuBLASLt's
// VEC16_UE4M3 mode has no pointer for. Written once for the host twin and the CUDA kernel so
// that both produce the same bits.
#pragma once

#include "scaling/scale_rules.h"  // QMESH_HOST_DEVICE

namespace qmesh::detail {

// alpha · a_scale_inv · b_scale_inv computed in float64, then rounded to fp32. The product of
// the two scales is exact in float64, and so is its product with an alpha of at most 5
// significant bits (1, a power of two, 0.75, ...): then the result is the exact product
// correctly rounded.
QMESH_HOST_DEVICE inline float folded_gemm_alpha(float alpha, float a_scale_inv,
                                                 float b_scale_inv) {
  return float(double(alpha) * (double(a_scale_inv) * double(b_scale_inv)));
}

}  // namespace qmesh::detail
