// CPU backend of the MXFP8 casts: the host twin of cuda/mxfp8_cast.cu. It walks the same
// 32 x 32 tiles, takes the same block amaxes (max of |x| bits, NaN above +inf), derives each
// E8M0 byte and multiplier with scaling/mx_scale_rule.h (the kernel's rule), encodes with the
// scalar conversions of qmesh/fp8.h and sums dbias in the order of ops/mxfp8_quantize.h, so
// codes, scales and dbias are the kernel's bits. Strips of 32 rows run on separate threads.
#include "cpu/mxfp8_cast.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "core/element_traits.h"
#include "cpu/parallel.h"
#include "qmesh/error.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "scaling/mx_scale_rule.h"

namespace qmesh::detail::cpu {

namespace {

constexpr int64_t kB = 32;
// Strips of 32 rows below this many elements stay on one thread.
constexpr int64_t kGrainElements = int64_t{1} << 16;

inline uint32_t abs_bits(float x) { return std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu; }

template <class Load, class Encode>
void mxfp8_cast(const MxCastJob& job) {
  using T = typename Load::type;
  const T* in = static_cast<const T*>(job.in);
  const int64_t strips = job.rows / kB, col_tiles = job.cols / kB;
  std::vector<float> partials(job.dbias ? strips * job.cols : 0);
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (kB * job.cols));
  parallel_for(strips, grain, [&](int64_t begin, int64_t end, int) {
    float v[kB][kB];
    for (int64_t rb = begin; rb < end; ++rb)
      for (int64_t cb = 0; cb < col_tiles; ++cb) {
        const int64_t r0 = rb * kB, c0 = cb * kB;
        uint32_t row_amax[kB] = {}, col_amax[kB] = {};
        for (int64_t i = 0; i < kB; ++i)
          for (int64_t j = 0; j < kB; ++j) {
            v[i][j] = Load::apply(in[(r0 + i) * job.cols + c0 + j]);
            row_amax[i] = std::max(row_amax[i], abs_bits(v[i][j]));
            col_amax[j] = std::max(col_amax[j], abs_bits(v[i][j]));
          }
        for (int64_t i = 0; i < kB; ++i) {
          const uint8_t byte = mx_scale_byte(std::bit_cast<float>(row_amax[i]), job.scaled_max);
          const float s = mx_scale(byte);
          for (int64_t j = 0; j < kB; ++j)
            job.out[(r0 + i) * job.cols + c0 + j] = Encode::apply(v[i][j] * s);
          job.scale[(r0 + i) * (job.cols / kB) + cb] = byte;
        }
        if (job.out_t) {
          for (int64_t j = 0; j < kB; ++j) {
            const uint8_t byte = mx_scale_byte(std::bit_cast<float>(col_amax[j]), job.scaled_max);
            const float s = mx_scale(byte);
            for (int64_t i = 0; i < kB; ++i)
              job.out_t[(c0 + j) * job.rows + r0 + i] = Encode::apply(v[i][j] * s);
            job.scale_t[(c0 + j) * (job.rows / kB) + rb] = byte;
          }
        }
        if (job.dbias) {
          for (int64_t j = 0; j < kB; ++j) {
            float s = 0.0f;
            for (int64_t i = 0; i < kB; ++i) s += v[i][j];
            partials[rb * job.cols + c0 + j] = s;
          }
        }
      }
  });
  if (!job.dbias) return;
  std::fill(job.dbias, job.dbias + job.cols, 0.0f);
  for (int64_t rb = 0; rb < strips; ++rb)
    for (int64_t c = 0; c < job.cols; ++c) job.dbias[c] += partials[rb * job.cols + c];
}

template <class Load>
void mxfp8_cast(const MxCastJob& job) {
  if (job.fp8 == DType::kFloat8E5M2)
    mxfp8_cast<Load, EncodeE5M2>(job);
  else
    mxfp8_cast<Load, EncodeE4M3>(job);
}

}  // namespace

void mxfp8_cast(const MxCastJob& job) {
  switch (job.in_dtype) {
    case DType::kFloat32:
      return mxfp8_cast<LoadFp32>(job);
    case DType::kBFloat16:
      return mxfp8_cast<LoadBf16>(job);
    case DType::kFloat16:
      return mxfp8_cast<LoadFp16>(job);
    default:
      QMESH_THROW("MXFP8 cast input must be fp32, bf16 or fp16, got ", dtype_name(job.in_dtype));
  }
}

void mxfp8_dequantize(const MxDequantizeJob& job) {
  const int64_t grain = std::max<int64_t>(1, kGrainElements / job.cols);
  parallel_for(job.rows, grain, [&](int64_t begin, int64_t end, int) {
    float staged[kB];
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c0 = 0; c0 < job.cols; c0 += kB) {
        const int64_t i = r * job.cols + c0;
        const float s = mx_scale_inv(job.scale[r * (job.cols / kB) + c0 / kB]);
        if (job.out_dtype == DType::kFloat32) {
          fp8_to_fp32(job.in + i, static_cast<float*>(job.out) + i, kB, job.fp8, s);
          continue;
        }
        fp8_to_fp32(job.in + i, staged, kB, job.fp8, s);
        uint16_t* out16 = static_cast<uint16_t*>(job.out) + i;
        if (job.out_dtype == DType::kBFloat16)
          fp32_to_bf16(staged, out16, kB);
        else
          fp32_to_fp16(staged, out16, kB);
      }
  });
}

}  // namespace qmesh::detail::cpu
