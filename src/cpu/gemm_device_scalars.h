// The host twin of the native NVFP4 GEMM's device scalars (cpu/gemm_device_scalars.cpp);
// arguments are checked by the caller (ops/gemm_device_scalars.h).
#pragma once

namespace qmesh::detail::cpu {

// out[0] = folded_gemm_alpha(alpha, *a_scale_inv, *b_scale_inv), out[1] = beta.
void write_gemm_device_scalars(const float* a_scale_inv, const float* b_scale_inv, float alpha,
                               float beta, float* out);

}  // namespace qmesh::detail::cpu
