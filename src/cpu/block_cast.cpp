// CPU backend of the block-scaled casts: the host twin of cuda/block_cast.cu. It walks the
// same 128 x 128 tiles, takes the same block amaxes (max of |x| bits, NaN above +inf), gets
// each scale from current_scale() (the rule the kernel evaluates on the device), encodes with
// the scalar conversions of qmesh/fp8.h and sums dbias in the order of ops/block_cast_job.h,
// so codes, scales and dbias are the kernel's bits. Strips of 128 rows run on separate threads.
#include "cpu/block_cast.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "core/element_traits.h"
#include "cpu/parallel.h"
#include "ops/cast_activation.h"  // abs_bits
#include "qmesh/error.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "qmesh/scaling/current_scaling.h"

namespace qmesh::detail::cpu {

namespace {

constexpr int64_t kB = kScaleBlock;
// Strips of 128 rows below this many elements stay on one thread.
constexpr int64_t kGrainElements = int64_t{1} << 16;

// A tile of x as fp32 (absent rows and columns 0) and the amaxes of its rows and columns.
struct Tile {
  std::vector<float> v = std::vector<float>(kB * kB);
  uint32_t row_amax[kB];
  uint32_t col_amax[kB];
  int64_t h = 0;  // rows present
  int64_t w = 0;  // columns present
};

template <class Load>
void load_tile(const BlockCastJob& job, int64_t r0, int64_t c0, Tile& t) {
  using T = typename Load::type;
  const T* in = static_cast<const T*>(job.in);
  t.h = std::min(kB, job.rows - r0);
  t.w = std::min(kB, job.cols - c0);
  std::fill(t.v.begin(), t.v.end(), 0.0f);
  std::fill(std::begin(t.row_amax), std::end(t.row_amax), 0u);
  std::fill(std::begin(t.col_amax), std::end(t.col_amax), 0u);
  for (int64_t r = 0; r < t.h; ++r) {
    const T* row = in + (r0 + r) * job.cols + c0;
    for (int64_t c = 0; c < t.w; ++c) {
      const float x = Load::apply(row[c]);
      t.v[r * kB + c] = x;
      t.row_amax[r] = std::max(t.row_amax[r], abs_bits(x));
      t.col_amax[c] = std::max(t.col_amax[c], abs_bits(x));
    }
  }
}

float scale_of(const BlockCastJob& job, uint32_t amax_bits) {
  return current_scale(std::bit_cast<float>(amax_bits), job.fp8, job.scaling);
}

// Encodes `lines` lines of a tile into out (row stride out_ld): line i holds the `len` values
// v[i * line_step + j * elem_step]. Its scale is `tile_scale` when line_scale_inv is null
// (128x128 tiles), else that of amax[i], whose 1 / scale goes to line_scale_inv[i].
template <class Encode>
void encode_lines(const BlockCastJob& job, const float* v, int64_t lines, int64_t len,
                  int64_t line_step, int64_t elem_step, const uint32_t* amax, float tile_scale,
                  uint8_t* out, int64_t out_ld, float* line_scale_inv) {
  for (int64_t i = 0; i < lines; ++i) {
    const float s = line_scale_inv ? scale_of(job, amax[i]) : tile_scale;
    for (int64_t j = 0; j < len; ++j)
      out[i * out_ld + j] = Encode::apply(v[i * line_step + j * elem_step] * s);
    if (line_scale_inv) line_scale_inv[i] = 1.0f / s;
  }
}

// Codes and scales of tile (rb, cb) in both layouts: the rows of the tile are lines of
// data, its columns lines of data_t.
template <class Encode>
void encode_tile(const BlockCastJob& job, int64_t rb, int64_t cb, const Tile& t) {
  const int64_t r0 = rb * kB, c0 = cb * kB;
  const bool tiles = job.block == BlockShape::k128x128;
  const float tile_scale =
      tiles ? scale_of(job, *std::max_element(t.row_amax, t.row_amax + kB)) : 0.0f;
  encode_lines<Encode>(job, t.v.data(), t.h, t.w, kB, 1, t.row_amax, tile_scale,
                       job.out + r0 * job.cols + c0, job.cols,
                       tiles ? nullptr : job.scale_inv + cb * job.scale_ld + r0);
  if (tiles) job.scale_inv[rb * job.scale_ld + cb] = 1.0f / tile_scale;
  if (!job.out_t) return;
  encode_lines<Encode>(job, t.v.data(), t.w, t.h, 1, kB, t.col_amax, tile_scale,
                       job.out_t + c0 * job.rows + r0, job.rows,
                       tiles ? nullptr : job.scale_inv_t + rb * job.scale_t_ld + c0);
  if (tiles) job.scale_inv_t[cb * job.scale_t_ld + rb] = 1.0f / tile_scale;
}

// The tile's column sums in the order of ops/block_cast_job.h.
void sum_tile(const Tile& t, float* partial) {
  constexpr int64_t kStride = kBlockRowGroups;
  for (int64_t c = 0; c < t.w; ++c) {
    float tile_sum = 0.0f;
    for (int64_t k = 0; k < kBlockGroupPairs; ++k) {
      float even = 0.0f, odd = 0.0f;
      for (int64_t r = 2 * k; r < kB; r += kStride) {
        even += t.v[r * kB + c];
        odd += t.v[(r + 1) * kB + c];
      }
      tile_sum += even + odd;
    }
    partial[c] = tile_sum;
  }
}

template <class Load, class Encode>
void block_cast(const BlockCastJob& job) {
  const int64_t row_tiles = (job.rows + kB - 1) / kB;
  const int64_t col_tiles = (job.cols + kB - 1) / kB;
  // Column sums of each strip of 128 rows, added in strip order at the end.
  std::vector<float> partials(job.dbias ? row_tiles * job.cols : 0);
  const int64_t grain = std::max<int64_t>(1, kGrainElements / (kB * job.cols));
  parallel_for(row_tiles, grain, [&](int64_t begin, int64_t end, int) {
    Tile t;
    for (int64_t rb = begin; rb < end; ++rb)
      for (int64_t cb = 0; cb < col_tiles; ++cb) {
        load_tile<Load>(job, rb * kB, cb * kB, t);
        encode_tile<Encode>(job, rb, cb, t);
        if (job.dbias) sum_tile(t, partials.data() + rb * job.cols + cb * kB);
      }
  });
  if (!job.dbias) return;
  std::fill(job.dbias, job.dbias + job.cols, 0.0f);
  for (int64_t rb = 0; rb < row_tiles; ++rb)
    for (int64_t c = 0; c < job.cols; ++c) job.dbias[c] += partials[rb * job.cols + c];
}

template <class Load>
void block_cast(const BlockCastJob& job) {
  if (job.fp8 == DType::kFloat8E5M2)
    block_cast<Load, EncodeE5M2>(job);
  else
    block_cast<Load, EncodeE4M3>(job);
}

}  // namespace

void block_cast(const BlockCastJob& job) {
  switch (job.in_dtype) {
    case DType::kFloat32:
      return block_cast<LoadFp32>(job);
    case DType::kBFloat16:
      return block_cast<LoadBf16>(job);
    case DType::kFloat16:
      return block_cast<LoadFp16>(job);
    default:
      QMESH_THROW("block cast input must be fp32, bf16 or fp16, got ", dtype_name(job.in_dtype));
  }
}

void block_dequantize(const uint8_t* in, DType fp8, BlockShape block, const float* scale_inv,
                      int64_t scale_ld, int64_t rows, int64_t cols, void* out, DType out_dtype) {
  const int64_t grain = std::max<int64_t>(1, kGrainElements / cols);
  parallel_for(rows, grain, [&](int64_t begin, int64_t end, int) {
    float staged[kB];
    for (int64_t r = begin; r < end; ++r)
      for (int64_t c0 = 0; c0 < cols; c0 += kB) {
        const int64_t kb = c0 / kB, w = std::min(kB, cols - c0), i = r * cols + c0;
        const float s = block == BlockShape::k1x128 ? scale_inv[kb * scale_ld + r]
                                                    : scale_inv[r / kB * scale_ld + kb];
        if (out_dtype == DType::kFloat32) {
          fp8_to_fp32(in + i, static_cast<float*>(out) + i, w, fp8, s);
          continue;
        }
        fp8_to_fp32(in + i, staged, w, fp8, s);
        uint16_t* out16 = static_cast<uint16_t*>(out) + i;
        if (out_dtype == DType::kBFloat16)
          fp32_to_bf16(staged, out16, w);
        else
          fp32_to_fp16(staged, out16, w);
      }
  });
}

}  // namespace qmesh::detail::cpu
