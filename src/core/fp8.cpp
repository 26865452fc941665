// Array FP8 conversions. Each loop body is the branch-free scalar conversion from fp8.h;
// target_clones builds AVX-512, AVX2 and baseline versions and picks one at load time, so a
// portable binary still runs the vectorized loop on the machine it lands on.
#include "qmesh/fp8.h"

#include "element_traits.h"
#include "qmesh/error.h"
#include "qmesh/float16.h"
#include "simd.h"

namespace qmesh {

namespace {

void require_fp8(DType fp8) {
  QMESH_CHECK(is_fp8(fp8), "FP8 conversion needs dtype fp8e4m3 or fp8e5m2, got ", dtype_name(fp8));
}

template <class Load, class Encode>
QMESH_SIMD_CLONES void encode_loop(const typename Load::type* in, uint8_t* out, size_t n,
                                   float scale) {
  for (size_t i = 0; i < n; ++i) out[i] = Encode::apply(Load::apply(in[i]) * scale);
}

using detail::EncodeE4M3;
using detail::EncodeE5M2;
using detail::LoadBf16;
using detail::LoadFp16;
using detail::LoadFp32;

template <class Load>
void encode(const typename Load::type* in, uint8_t* out, size_t n, DType fp8, float scale) {
  require_fp8(fp8);
  if (fp8 == DType::kFloat8E4M3)
    encode_loop<Load, EncodeE4M3>(in, out, n, scale);
  else
    encode_loop<Load, EncodeE5M2>(in, out, n, scale);
}

QMESH_SIMD_CLONES void decode_e4m3(const uint8_t* in, float* out, size_t n, float scale_inv) {
  for (size_t i = 0; i < n; ++i) out[i] = e4m3_to_float(in[i]) * scale_inv;
}
QMESH_SIMD_CLONES void decode_e5m2(const uint8_t* in, float* out, size_t n, float scale_inv) {
  for (size_t i = 0; i < n; ++i) out[i] = e5m2_to_float(in[i]) * scale_inv;
}

}  // namespace

float fp8_max(DType fp8) {
  require_fp8(fp8);
  return fp8 == DType::kFloat8E4M3 ? kE4M3Max : kE5M2Max;
}

void fp32_to_fp8(const float* in, uint8_t* out, size_t n, DType fp8, float scale) {
  encode<LoadFp32>(in, out, n, fp8, scale);
}
void bf16_to_fp8(const uint16_t* in, uint8_t* out, size_t n, DType fp8, float scale) {
  encode<LoadBf16>(in, out, n, fp8, scale);
}
void fp16_to_fp8(const uint16_t* in, uint8_t* out, size_t n, DType fp8, float scale) {
  encode<LoadFp16>(in, out, n, fp8, scale);
}

void fp8_to_fp32(const uint8_t* in, float* out, size_t n, DType fp8, float scale_inv) {
  require_fp8(fp8);
  if (fp8 == DType::kFloat8E4M3)
    decode_e4m3(in, out, n, scale_inv);
  else
    decode_e5m2(in, out, n, scale_inv);
}

}  // namespace qmesh
