#include "cpu/gemm_device_scalars.h"

#include "ops/gemm_device_scalars_rule.h"

namespace qmesh::detail::cpu {

void write_gemm_device_scalars(const float* a_scale_inv, const float* b_scale_inv, float alpha,
                               float beta, float* out) {
  out[0] = folded_gemm_alpha(alpha, *a_scale_inv, *b_scale_inv);
  out[1] = beta;
}

}  // namespace qmesh::detail::cpu
