// CPU backend of the cast ops. Every loop body is the branch-free scalar conversion of
// qmesh/fp8.h (bit-identical to CUDA's __nv_cvt_float_to_fp8 with __NV_SATFINITE), compiled
// for AVX-512 / AVX2 / baseline and picked at load time; large tensors are split over threads.
#include "cpu/cast.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "core/element_traits.h"
#include "core/simd.h"
#include "cpu/parallel.h"
#include "ops/cast_activation.h"
#include "qmesh/error.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"

namespace qmesh::detail::cpu {

namespace {

// Below this many elements a cast stays on the calling thread.
constexpr int64_t kGrainElements = int64_t{1} << 16;
// Rows per strip of the transposing path, and the edge of the tiles it is transposed in: a
// strip of 64 rows of codes stays in L2 between being written and being transposed.
constexpr int64_t kTile = 64;

// |x| as bits: for non-negative floats the unsigned order is the float order, and every NaN
// sorts above +inf, which is the NaN-propagating amax policy (ops/amax.h).
inline uint32_t abs_bits(float x) { return std::bit_cast<uint32_t>(x) & 0x7FFFFFFFu; }

template <class Load, class Encode>
QMESH_SIMD_CLONES uint32_t encode_span(const typename Load::type* in, uint8_t* out, int64_t n,
                                       float scale) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float x = Load::apply(in[i]);
    m = std::max(m, abs_bits(x));
    out[i] = Encode::apply(x * scale);
  }
  return m;
}

template <class Load>
QMESH_SIMD_CLONES uint32_t amax_span(const typename Load::type* in, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, abs_bits(Load::apply(in[i])));
  return m;
}

template <class Load>
QMESH_SIMD_CLONES void accumulate_span(const typename Load::type* in, float* acc, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += Load::apply(in[i]);
}

// Codes and amax, or the amax alone when out is null.
template <class Load, class Encode>
uint32_t encode_or_amax(const typename Load::type* in, uint8_t* out, int64_t n, float scale) {
  return out ? encode_span<Load, Encode>(in, out, n, scale) : amax_span<Load>(in, n);
}

// out[i] = the value a cast with activation kAct quantizes (pre: kDgelu only).
template <class Load, CastActivation kAct>
QMESH_SIMD_CLONES void activate_span(const typename Load::type* in, const typename Load::type* pre,
                                     float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = activate<kAct>(Load::apply(in[i]),
                            kAct == CastActivation::kDgelu ? Load::apply(pre[i]) : 0.0f);
}

// Swaps the `bits`-wide fields of a at odd positions with those of b at even positions: one
// stage of the 8 x 8 byte transpose below.
inline void swap_fields(uint64_t& a, uint64_t& b, int bits, uint64_t mask) {
  const uint64_t t = ((a >> bits) ^ b) & mask;
  b ^= t;
  a ^= t << bits;
}

// Transposes the 8 x 8 bytes at src (row stride src_stride) into dst (row stride dst_stride),
// holding each row in a uint64_t: three stages swap 1-, 2- and 4-byte fields.
void transpose_8x8(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  static_assert(std::endian::native == std::endian::little);
  uint64_t r[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&r[i], src + i * src_stride, 8);
  for (int i = 0; i < 8; i += 2) swap_fields(r[i], r[i + 1], 8, 0x00FF00FF00FF00FFull);
  for (int i : {0, 1, 4, 5}) swap_fields(r[i], r[i + 2], 16, 0x0000FFFF0000FFFFull);
  for (int i = 0; i < 4; ++i) swap_fields(r[i], r[i + 4], 32, 0x00000000FFFFFFFFull);
  for (int i = 0; i < 8; ++i) std::memcpy(dst + i * dst_stride, &r[i], 8);
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for an h x w block of bytes.
void transpose_block(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride,
                     int64_t h, int64_t w) {
  const int64_t h8 = h / 8 * 8, w8 = w / 8 * 8;
  for (int64_t r = 0; r < h8; r += 8)
    for (int64_t c = 0; c < w8; c += 8)
      transpose_8x8(src + r * src_stride + c, src_stride, dst + c * dst_stride + r, dst_stride);
  for (int64_t c = 0; c < w; ++c)  // the ragged right and bottom edges
    for (int64_t r = c < w8 ? h8 : 0; r < h; ++r) dst[c * dst_stride + r] = src[r * src_stride + c];
}

void write_scalars(const CastJob& job, uint32_t amax_bits) {
  if (job.amax_update == AmaxUpdate::kRunningMax)
    amax_bits = std::max(amax_bits, std::bit_cast<uint32_t>(*job.amax));
  *job.amax = std::bit_cast<float>(amax_bits);
  if (job.out) *job.scale_inv = 1.0f / *job.scale;
}

// Rowwise codes and/or amax over the flat element range; split over threads.
template <class Load, class Encode, CastActivation kAct>
void cast_flat(const CastJob& job) {
  using T = typename Load::type;
  const T* in = static_cast<const T*>(job.in);
  const T* pre = static_cast<const T*>(job.pre);
  const int64_t n = job.rows * job.cols;
  const float scale = job.out ? *job.scale : 0.0f;
  std::vector<uint32_t> partial(parallel_chunks(n, kGrainElements), 0);
  parallel_for(n, kGrainElements, [&](int64_t begin, int64_t end, int chunk) {
    uint8_t* out = job.out ? job.out + begin : nullptr;
    if constexpr (kAct == CastActivation::kNone) {
      partial[chunk] = encode_or_amax<Load, Encode>(in + begin, out, end - begin, scale);
    } else {
      constexpr int64_t kBlock = 4096;  // fp32 staging that stays in L1
      float staged[kBlock];
      uint32_t m = 0;
      for (int64_t i = begin; i < end; i += kBlock) {
        const int64_t len = std::min(kBlock, end - i);
        activate_span<Load, kAct>(in + i, pre ? pre + i : nullptr, staged, len);
        m = std::max(m, encode_or_amax<LoadFp32, Encode>(staged, out ? out + (i - begin) : nullptr,
                                                         len, scale));
      }
      partial[chunk] = m;
    }
  });
  write_scalars(job, *std::max_element(partial.begin(), partial.end()));
}

// Rowwise codes plus the transposed copy and/or the column sums, in strips of 64 rows; strips are
// split over threads, each with its own column-sum accumulator (added in chunk order).
template <class Load, class Encode, CastActivation kAct>
void cast_tiled(const CastJob& job) {
  using T = typename Load::type;
  const T* in = static_cast<const T*>(job.in);
  const T* pre = static_cast<const T*>(job.pre);
  const int64_t rows = job.rows, cols = job.cols;
  const float scale = *job.scale;
  const int64_t row_blocks = (rows + kTile - 1) / kTile;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (kTile * cols));
  const int chunks = parallel_chunks(row_blocks, grain);
  std::vector<uint32_t> partial(chunks, 0);
  std::vector<std::vector<float>> sums(job.dbias ? chunks : 0);
  parallel_for(row_blocks, grain, [&](int64_t begin, int64_t end, int chunk) {
    uint32_t m = 0;
    float* acc = nullptr;
    std::vector<float> staged(kAct == CastActivation::kNone ? 0 : cols);
    if (job.dbias) {
      sums[chunk].assign(cols, 0.0f);
      acc = sums[chunk].data();
    }
    for (int64_t rb = begin; rb < end; ++rb) {
      const int64_t r0 = rb * kTile, h = std::min(kTile, rows - r0);
      // Whole rows first (long vectorized loops), then the strip of codes, still in cache, is
      // transposed tile by tile.
      for (int64_t r = r0; r < r0 + h; ++r) {
        if constexpr (kAct == CastActivation::kNone) {
          m = std::max(m,
                       encode_span<Load, Encode>(in + r * cols, job.out + r * cols, cols, scale));
          if (acc) accumulate_span<Load>(in + r * cols, acc, cols);
        } else {
          activate_span<Load, kAct>(in + r * cols, pre ? pre + r * cols : nullptr, staged.data(),
                                    cols);
          m = std::max(
              m, encode_span<LoadFp32, Encode>(staged.data(), job.out + r * cols, cols, scale));
          if (acc) accumulate_span<LoadFp32>(staged.data(), acc, cols);
        }
      }
      if (!job.out_t) continue;
      for (int64_t c0 = 0; c0 < cols; c0 += kTile)
        transpose_block(job.out + r0 * cols + c0, cols, job.out_t + c0 * rows + r0, rows, h,
                        std::min(kTile, cols - c0));
    }
    partial[chunk] = m;
  });
  if (job.dbias) {
    std::memcpy(job.dbias, sums[0].data(), cols * sizeof(float));
    for (int c = 1; c < chunks; ++c) accumulate_span<LoadFp32>(sums[c].data(), job.dbias, cols);
  }
  write_scalars(job, *std::max_element(partial.begin(), partial.end()));
}

template <class Load, class Encode, CastActivation kAct>
void cast_jobs(std::span<const CastJob> jobs) {
  for (const CastJob& job : jobs) {
    if (job.out_t || job.dbias)
      cast_tiled<Load, Encode, kAct>(job);
    else
      cast_flat<Load, Encode, kAct>(job);
  }
}

template <class Load, class Encode>
void cast_jobs(CastActivation activation, std::span<const CastJob> jobs) {
  switch (activation) {
    case CastActivation::kNone:
      return cast_jobs<Load, Encode, CastActivation::kNone>(jobs);
    case CastActivation::kGelu:
      return cast_jobs<Load, Encode, CastActivation::kGelu>(jobs);
    case CastActivation::kDgelu:
      return cast_jobs<Load, Encode, CastActivation::kDgelu>(jobs);
  }
}

template <class Load>
void cast_jobs(const CastSpec& spec, std::span<const CastJob> jobs) {
  if (spec.fp8 == DType::kFloat8E5M2)
    cast_jobs<Load, EncodeE5M2>(spec.activation, jobs);
  else
    cast_jobs<Load, EncodeE4M3>(spec.activation, jobs);
}

}  // namespace

void cast(const CastSpec& spec, std::span<const CastJob> jobs) {
  switch (spec.in_dtype) {
    case DType::kFloat32:
      return cast_jobs<LoadFp32>(spec, jobs);
    case DType::kBFloat16:
      return cast_jobs<LoadBf16>(spec, jobs);
    case DType::kFloat16:
      return cast_jobs<LoadFp16>(spec, jobs);
    default:
      QMESH_THROW("cast input must be fp32, bf16 or fp16, got ", dtype_name(spec.in_dtype));
  }
}

void dequantize(const uint8_t* in, DType fp8, const float* scale_inv, void* out, DType out_dtype,
                int64_t n) {
  const float s = *scale_inv;
  parallel_for(n, kGrainElements, [&](int64_t begin, int64_t end, int) {
    if (out_dtype == DType::kFloat32) {
      fp8_to_fp32(in + begin, static_cast<float*>(out) + begin, end - begin, fp8, s);
      return;
    }
    constexpr int64_t kBlock = 4096;  // fp32 staging that stays in L1
    float staged[kBlock];
    uint16_t* out16 = static_cast<uint16_t*>(out);
    for (int64_t i = begin; i < end; i += kBlock) {
      const int64_t len = std::min(kBlock, end - i);
      fp8_to_fp32(in + i, staged, len, fp8, s);
      if (out_dtype == DType::kBFloat16)
        fp32_to_bf16(staged, out16 + i, len);
      else
        fp32_to_fp16(staged, out16 + i, len);
    }
  });
}

}  // namespace qmesh::detail::cpu
