// CUDA backend of the block-scaled casts (ops/block_quantize.h); cpu/block_cast.cpp is its
// host twin, bit for bit.
//
// One thread block of 256 threads per 128 x 128 tile of x (every 1x128 block, 128x1 block of
// the columnwise copy and 128x128 tile lies inside one tile). Thread (group = tid / 16,
// lane16 = tid % 16) holds the 8 columns lane16 * 8.. of tile rows group, group + 16, ...,
// group + 112 in registers (64 values, 16-bit inputs kept 16-bit), read with 16-byte loads:
// one pass over x.
//   - row amax: the 16 threads of a row are one half-warp: four xor shuffles;
//   - column amax (and column sums): per thread over its 8 rows, one shuffle joins the two
//     groups of a warp, shared memory the 8 warps;
//   - scales: current_scale_rule (scaling/scale_rules.h, the rule current_scale() evaluates),
//     scale_inv = 1 / scale;
//   - rowwise codes: 8-byte stores, 16 threads writing a row's 128 contiguous bytes;
//   - columnwise codes: encoded with the column (or tile) scales into a 128 x 128 byte tile in
//     shared memory, then thread (column = tid % 128, half = tid / 128) writes 64 contiguous
//     bytes of columnwise row c0 + column as four 16-byte stores (two whole 32-byte sectors);
//     the 32 lanes of a warp read 32 consecutive bytes of one shared row: no bank conflicts.
// Elements past the tensor's edge read as 0 (changing neither amax nor sums) and are not
// stored; unaligned or ragged tensors use element accesses in the same kernel.
#include <algorithm>
#include <cstdint>
#include <optional>

#include "cuda/block_cast.h"
#include "cuda/cast_elements.cuh"
#include "cuda/stream_scratch.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/fp8.h"
#include "scaling/scale_rules.h"

namespace qmesh::detail::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kB = 128;                                          // tile edge
constexpr int kVec = 8;                                          // columns per thread
constexpr int kLanes = kB / kVec;                                // threads per tile row: 16
constexpr int kGroups = kThreads / kLanes;                       // row groups: 16
constexpr int kPasses = kB / kGroups;                            // rows per thread: 8
constexpr int kChunk = 16;                                       // bytes per columnwise store
constexpr int kChunksPerThread = kB / kChunk / (kThreads / kB);  // 4
static_assert(kGroups == kBlockRowGroups && kWarps == kBlockGroupPairs,
              "the dbias order of ops/block_cast_job.h");

struct BlockParams {
  BlockCastJob job;
  float* partials;  // null: no dbias; else fp32 [row_tiles, cols]: each tile's column sums
  float fp8_max;
  bool vec_in;     // 16-byte loads legal: in 16-byte aligned, cols % 8 == 0
  bool vec_out;    // 8-byte rowwise stores legal: out 8-byte aligned, cols % 8 == 0
  bool vec_out_t;  // 16-byte columnwise stores legal: out_t 16-byte aligned, rows % 16 == 0
};

__device__ __forceinline__ float block_scale(const BlockParams& p, uint32_t amax_bits) {
  return current_scale_rule(__uint_as_float(amax_bits), p.fp8_max,
                            p.job.scaling.power_of_two_scales, p.job.scaling.amax_epsilon);
}

// The 8 elements of row r, columns c.. as stored (0 past the edges): 16-bit inputs stay
// 16-bit in registers until they are used.
template <class T>
__device__ __forceinline__ void load_row(const BlockParams& p, int64_t r, int64_t c, T (&v)[kVec]) {
  const T* in = static_cast<const T*>(p.job.in) + r * p.job.cols;
  if (p.vec_in && r < p.job.rows && c + kVec <= p.job.cols) {
    const uint4* src = reinterpret_cast<const uint4*>(in + c);
#pragma unroll
    for (int k = 0; k < int(kVec * sizeof(T) / 16); ++k) reinterpret_cast<uint4*>(v)[k] = src[k];
  } else {
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = r < p.job.rows && c + k < p.job.cols ? in[c + k] : T{};
  }
}

// codes[k] = encode(v[k] * scale[k]), two values per conversion instruction (each converted as
// __nv_cvt_float_to_fp8 would, saturating, round to nearest even).
template <__nv_fp8_interpretation_t kFmt, class T>
__device__ __forceinline__ void encode(const T (&v)[kVec], const float (&scale)[kVec],
                                       uint8_t (&codes)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; k += 2) {
    const __nv_fp8x2_storage_t pair = __nv_cvt_float2_to_fp8x2(
        make_float2(load_float(v[k]) * scale[k], load_float(v[k + 1]) * scale[k + 1]),
        __NV_SATFINITE, kFmt);
    codes[k] = static_cast<uint8_t>(pair & 0xFF);
    codes[k + 1] = static_cast<uint8_t>(pair >> 8);
  }
}

template <class T, __nv_fp8_interpretation_t kFmt, bool kTiles>
__global__ void __launch_bounds__(kThreads, 2) block_cast_kernel(BlockParams p) {
  __shared__ alignas(16) uint8_t codes_t[kB][kB];  // columnwise codes, [tile row][tile column]
  __shared__ uint32_t col_amax_w[kWarps][kB];
  __shared__ float col_sum_w[kWarps][kB];
  __shared__ float col_scale[kB];
  __shared__ uint32_t tile_amax_w[kB / 32];
  const int64_t col_tiles = (p.job.cols + kB - 1) / kB;
  const int64_t rb = blockIdx.x / col_tiles, cb = blockIdx.x % col_tiles;
  const int64_t r0 = rb * kB, c0 = cb * kB;
  const int lane16 = threadIdx.x % kLanes, group = threadIdx.x / kLanes;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t c = c0 + lane16 * kVec;

  alignas(16) T v[kPasses][kVec];
  uint32_t row_amax[kPasses];
  uint32_t col_amax[kVec] = {};
#pragma unroll
  for (int i = 0; i < kPasses; ++i) load_row<T>(p, r0 + group + i * kGroups, c, v[i]);
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    uint32_t m = 0;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const uint32_t a = abs_bits(load_float(v[i][k]));
      m = max(m, a);
      col_amax[k] = max(col_amax[k], a);
    }
#pragma unroll
    for (int off = 1; off < kLanes; off *= 2) m = max(m, __shfl_xor_sync(0xFFFFFFFFu, m, off));
    row_amax[i] = m;
  }
#pragma unroll
  for (int k = 0; k < kVec; ++k) {
    const uint32_t m = max(col_amax[k], __shfl_xor_sync(0xFFFFFFFFu, col_amax[k], 16));
    if (lane < kLanes) col_amax_w[warp][lane16 * kVec + k] = m;
  }
  if (p.partials) {
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kPasses; ++i) s += load_float(v[i][k]);
      s += __shfl_xor_sync(0xFFFFFFFFu, s, 16);
      if (lane < kLanes) col_sum_w[warp][lane16 * kVec + k] = s;
    }
  }
  __syncthreads();

  // Threads 0..127 (four whole warps): column tid's amax, scale and sum.
  if (threadIdx.x < kB) {
    const int tc = threadIdx.x;
    uint32_t m = 0;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = max(m, col_amax_w[w][tc]);
    if constexpr (kTiles) {
      m = __reduce_max_sync(0xFFFFFFFFu, m);
      if (lane == 0) tile_amax_w[warp] = m;
    } else {
      const float s = block_scale(p, m);
      col_scale[tc] = s;
      if (p.job.out_t && c0 + tc < p.job.cols)
        p.job.scale_inv_t[rb * p.job.scale_t_ld + c0 + tc] = 1.0f / s;
    }
    if (p.partials && c0 + tc < p.job.cols) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += col_sum_w[w][tc];
      p.partials[rb * p.job.cols + c0 + tc] = s;
    }
  }
  __syncthreads();

  float tile_scale = 0.0f;
  if constexpr (kTiles) {
    uint32_t m = 0;
#pragma unroll
    for (int w = 0; w < kB / 32; ++w) m = max(m, tile_amax_w[w]);
    tile_scale = block_scale(p, m);
    if (threadIdx.x == 0) {
      p.job.scale_inv[rb * p.job.scale_ld + cb] = 1.0f / tile_scale;
      if (p.job.out_t) p.job.scale_inv_t[cb * p.job.scale_t_ld + rb] = 1.0f / tile_scale;
    }
  }

  // Rowwise codes (and, with tiles, the same codes for the columnwise copy).
  float col_s[kVec];
#pragma unroll
  for (int k = 0; k < kVec; ++k) col_s[k] = kTiles ? tile_scale : col_scale[lane16 * kVec + k];
#pragma unroll
  for (int i = 0; i < kPasses; ++i) {
    const int tr = group + i * kGroups;
    const int64_t r = r0 + tr;
    const float s = kTiles ? tile_scale : block_scale(p, row_amax[i]);
    float row_s[kVec];
#pragma unroll
    for (int k = 0; k < kVec; ++k) row_s[k] = s;
    alignas(8) uint8_t codes[kVec];
    encode<kFmt>(v[i], row_s, codes);
    if (r < p.job.rows) {
      uint8_t* out = p.job.out + r * p.job.cols;
      if (p.vec_out && c + kVec <= p.job.cols) {
        *reinterpret_cast<uint2*>(out + c) = *reinterpret_cast<const uint2*>(codes);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k)
          if (c + k < p.job.cols) out[c + k] = codes[k];
      }
      if (!kTiles && lane16 == 0) p.job.scale_inv[cb * p.job.scale_ld + r] = 1.0f / s;
    }
    if (p.job.out_t) {
      if constexpr (!kTiles) encode<kFmt>(v[i], col_s, codes);
      *reinterpret_cast<uint2*>(&codes_t[tr][lane16 * kVec]) = *reinterpret_cast<uint2*>(codes);
    }
  }
  if (!p.job.out_t) return;
  __syncthreads();

  // Columnwise row c0 + tc holds tile column tc: bytes of tile rows chunk * 16...
  const int tc = threadIdx.x % kB;
  if (c0 + tc >= p.job.cols) return;
  uint8_t* out_t = p.job.out_t + (c0 + tc) * p.job.rows;
#pragma unroll
  for (int j = 0; j < kChunksPerThread; ++j) {
    const int tr = (threadIdx.x / kB * kChunksPerThread + j) * kChunk;
    alignas(16) uint8_t col[kChunk];
#pragma unroll
    for (int k = 0; k < kChunk; ++k) col[k] = codes_t[tr + k][tc];
    const int64_t r = r0 + tr;
    if (p.vec_out_t && r + kChunk <= p.job.rows) {
      *reinterpret_cast<uint4*>(out_t + r) = *reinterpret_cast<const uint4*>(col);
    } else {
#pragma unroll
      for (int k = 0; k < kChunk; ++k)
        if (r + k < p.job.rows) out_t[r + k] = col[k];
    }
  }
}

template <class T, __nv_fp8_interpretation_t kFmt>
__global__ void block_dequantize_kernel(const uint8_t* in, bool tiles, const float* scale_inv,
                                        int64_t scale_ld, int64_t rows, int64_t cols, T* out) {
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, kb = i % cols / kB;
    const float s = tiles ? scale_inv[r / kB * scale_ld + kb] : scale_inv[kb * scale_ld + r];
    store_float(out + i, decode_fp8<kFmt>(in[i]) * s);
  }
}

bool aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

}  // namespace

void block_cast(int device, const BlockCastJob& job, Stream stream) {
  const DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream.handle);
  const int64_t row_tiles = (job.rows + kB - 1) / kB;
  const int64_t tiles = row_tiles * ((job.cols + kB - 1) / kB);
  QMESH_CHECK(tiles < (int64_t{1} << 31), "block cast of a [", job.rows, ", ", job.cols,
              "] tensor needs ", tiles, " tiles, more than one CUDA launch holds");
  BlockParams p{};
  p.job = job;
  p.fp8_max = fp8_max(job.fp8);
  p.vec_in = aligned16(job.in) && job.cols % kVec == 0;
  p.vec_out = aligned8(job.out) && job.cols % kVec == 0;
  p.vec_out_t = job.out_t && aligned16(job.out_t) && job.rows % kChunk == 0;
  std::optional<StreamScratch<float>> scratch;
  if (job.dbias) p.partials = scratch.emplace(size_t(row_tiles * job.cols), s).get();
  dispatch_dtypes(job.in_dtype, job.fp8, [&](auto type, auto fmt) {
    using T = typename decltype(type)::type;
    constexpr auto kFmt = decltype(fmt)::value;
    const auto kernel = job.block == BlockShape::k128x128 ? block_cast_kernel<T, kFmt, true>
                                                          : block_cast_kernel<T, kFmt, false>;
    kernel<<<static_cast<unsigned>(tiles), kThreads, 0, s>>>(p);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
  if (p.partials) sum_tile_partials(p.partials, row_tiles, job.cols, job.dbias, s);
}

void block_dequantize(int device, const uint8_t* in, DType fp8, BlockShape block,
                      const float* scale_inv, int64_t scale_ld, int64_t rows, int64_t cols,
                      void* out, DType out_dtype, Stream stream) {
  const DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream.handle);
  const int64_t n = rows * cols;
  const auto blocks =
      static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 65536));
  dispatch_dtypes(out_dtype, fp8, [&](auto type, auto fmt) {
    using T = typename decltype(type)::type;
    block_dequantize_kernel<T, decltype(fmt)::value><<<blocks, kThreads, 0, s>>>(
        in, block == BlockShape::k128x128, scale_inv, scale_ld, rows, cols, static_cast<T*>(out));
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
