#include "qmesh/float16.h"

#include "simd.h"

namespace qmesh {

QMESH_SIMD_CLONES void fp32_to_bf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bf16(in[i]);
}
QMESH_SIMD_CLONES void bf16_to_fp32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(in[i]);
}
QMESH_SIMD_CLONES void fp32_to_fp16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_fp16(in[i]);
}
QMESH_SIMD_CLONES void fp16_to_fp32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = fp16_to_float(in[i]);
}

}  // namespace qmesh
