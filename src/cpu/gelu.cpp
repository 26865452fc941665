#include "cpu/gelu.h"

#include "core/simd.h"

namespace qmesh {

QMESH_SIMD_CLONES void gelu_inplace(float* r, int64_t n) {
  for (int64_t j = 0; j < n; ++j) r[j] = gelu(r[j]);
}

QMESH_SIMD_CLONES void dgelu_mul_inplace(float* r, const float* pre, int64_t n) {
  for (int64_t j = 0; j < n; ++j) r[j] *= dgelu(pre[j]);
}

}  // namespace qmesh
