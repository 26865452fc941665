// CUDA backend of the cast ops.
//
// Every element goes through the saturating round-to-nearest-even conversion of x * scale
// (__nv_cvt_float2_to_fp8x2 with __NV_SATFINITE: two elements per instruction, each converted
// as __nv_cvt_float_to_fp8 would): the conversion qmesh/fp8.h reproduces bit for bit on the
// host, so codes match the CPU backend.
// amax is fused: each thread keeps max(|x| bits), a warp reduces with __reduce_max_sync, the
// block combines its warps in shared memory and issues one atomicMax on the float's bits
// (non-negative floats order like their bit patterns and NaN sorts above +inf, which gives the
// NaN-propagating policy of ops/amax.h). A cast with an activation (ops/cast_activation.h:
// GELU, or GELU's backward with the pre-activation loaded beside the gradient) applies it to
// each loaded value first, with the host twin's operations. Loads and stores move 16 bytes per
// instruction when the pointers and extents allow it, else the same kernel falls back to element
// accesses.
// A job without outputs (amax, gelu_amax, dgelu_amax: current scaling's pass before the cast)
// runs the amax kernel, which only loads and reduces: with an activation it evaluates an
// element only where activation_bound (ops/cast_activation.h) says that it may raise the
// maximum found so far, which leaves the result unchanged and the pass bound by memory
// rather than by GELU's arithmetic for most data (docs/benchmarks/cast-kernel-predictions.md).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "cuda/block_sum.h"
#include "cuda/cast.h"
#include "cuda/cast_elements.cuh"
#include "cuda/device_scalar.h"
#include "cuda/stream_scratch.h"
#include "ops/cast_activation.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/error.h"

namespace qmesh::detail::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kVec = kCodeVec;  // elements per thread per step: one 16-byte store of codes
// Flat kernel: elements one block covers.
constexpr int kFlatIters = 4;
constexpr int64_t kFlatChunk = int64_t{kThreads} * kVec * kFlatIters;
// Groups per launch of the flat kernel. Its parameter struct (64 bytes a group) is a little over
// the classic 4 KiB limit of kernel parameters, which CUDA 12.1 raised to 32764 bytes on Volta
// and newer.
constexpr int kMaxGroups = 64;
// Tiled kernel: tiles of 128 x 64 elements; each thread owns 16 columns of two rows 64 apart.
constexpr int kTileRows = 128;
constexpr int kTileCols = 64;
constexpr int kRowStep = kThreads / (kTileCols / kVec);  // 64
constexpr int kRowsPerThread = kTileRows / kRowStep;     // 2
static_assert(kRowsPerThread == 2, "the column sums add a thread's two rows");
static_assert(kTileRows == (kThreads / kTileCols) * 2 * kVec,
              "the transposed phase writes 2 x 16 bytes per thread");

// codes[k] = encode(v[k] * scale), two values per conversion instruction (the same
// round-to-nearest-even saturating conversion as the one-value form, element by element).
template <__nv_fp8_interpretation_t kFmt>
__device__ __forceinline__ void encode_vec(const float (&v)[kVec], float scale,
                                           uint8_t (&codes)[kVec]) {
#pragma unroll
  for (int k = 0; k < kVec; k += 2) {
    const __nv_fp8x2_storage_t pair =
        __nv_cvt_float2_to_fp8x2(make_float2(v[k] * scale, v[k + 1] * scale), __NV_SATFINITE, kFmt);
    codes[k] = static_cast<uint8_t>(pair & 0xFF);
    codes[k + 1] = static_cast<uint8_t>(pair >> 8);
  }
}

// Loads N elements starting at in[i] (n elements in all) as floats, in 16-byte loads where
// `vec` (in + i 16-byte aligned) and all of them are in range; out-of-range elements read as
// 0, which changes neither amax nor column sums.
template <class T, int N>
__device__ __forceinline__ void load_vec(const T* in, int64_t i, int64_t n, bool vec,
                                         float (&v)[N]) {
  static_assert(N * sizeof(T) % 16 == 0, "whole 16-byte loads");
  if (vec && i + N <= n) {
    constexpr int kLoads = N * sizeof(T) / 16;
    alignas(16) T raw[N];
    const uint4* src = reinterpret_cast<const uint4*>(in + i);
#pragma unroll
    for (int k = 0; k < kLoads; ++k) reinterpret_cast<uint4*>(raw)[k] = src[k];
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = load_float(raw[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = i + k < n ? load_float(in[i + k]) : 0.0f;
  }
}

// v[k] = activate<kAct>(v[k], pre[row + i + k]): the values a fused cast quantizes (pre:
// kDgelu only; i and n as for load_vec, within the row that starts at element `row`).
template <CastActivation kAct, class T>
__device__ __forceinline__ void activate_vec(const T* pre, int64_t row, int64_t i, int64_t n,
                                             bool vec, float (&v)[kVec]) {
  if constexpr (kAct != CastActivation::kNone) {
    float p[kVec] = {};
    if constexpr (kAct == CastActivation::kDgelu) load_vec(pre + row, i, n, vec, p);
#pragma unroll
    for (int k = 0; k < kVec; ++k) v[k] = activate<kAct>(v[k], p[k]);
  }
}

// ---- flat kernel: quantize / amax / grouped quantize ---------------------------------------

struct FlatGroup {
  const void* in;
  const void* pre;  // CastActivation::kDgelu
  uint8_t* out;
  const float* scale;
  float* scale_inv;
  float* amax;
  bool replace_amax;  // AmaxUpdate::kReplace: zeroed before the kernel's atomicMax
  int64_t n;
  int64_t first_block;
};
struct FlatParams {
  FlatGroup groups[kMaxGroups];
  int count;
};
static_assert(sizeof(FlatParams) <= 32764, "kernel parameters are limited to 32764 bytes");

__global__ void zero_amax_kernel(FlatParams p) {
  if (threadIdx.x < p.count && p.groups[threadIdx.x].replace_amax)
    *p.groups[threadIdx.x].amax = 0.0f;
}

template <class T, __nv_fp8_interpretation_t kFmt, CastActivation kAct>
__global__ void __launch_bounds__(kThreads) cast_flat_kernel(FlatParams p) {
  int g = 0;
  while (g + 1 < p.count && p.groups[g + 1].first_block <= int64_t(blockIdx.x)) ++g;
  const FlatGroup& grp = p.groups[g];
  const T* in = static_cast<const T*>(grp.in);
  const T* pre = static_cast<const T*>(grp.pre);
  const bool vec = reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(grp.out) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(pre) % 16 == 0;
  const float scale = *grp.scale;
  const int64_t base = (int64_t(blockIdx.x) - grp.first_block) * kFlatChunk;
  uint32_t m = 0;
#pragma unroll 1
  for (int it = 0; it < kFlatIters; ++it) {
    const int64_t i = base + (int64_t(it) * kThreads + threadIdx.x) * kVec;
    if (i >= grp.n) break;
    float v[kVec];
    load_vec(in, i, grp.n, vec, v);
    activate_vec<kAct>(pre, 0, i, grp.n, vec, v);
    alignas(16) uint8_t codes[kVec];
    encode_vec<kFmt>(v, scale, codes);
#pragma unroll
    for (int k = 0; k < kVec; ++k) m = max(m, abs_bits(v[k]));
    store_vec(grp.out, i, grp.n, vec, codes);
  }
  block_amax<kThreads>(m, grp.amax);
  if (int64_t(blockIdx.x) == grp.first_block && threadIdx.x == 0) *grp.scale_inv = 1.0f / scale;
}

// ---- amax kernel: max |activate(in)| alone (amax, gelu_amax, dgelu_amax) -------------------

// 16-byte loads per input that a thread issues before it uses any.
constexpr int kAmaxLoads = 4;
// Elements of T per 16-byte load, and per block and step of the amax kernel.
template <class T>
constexpr int kPerLoad = 16 / sizeof(T);
template <class T>
__host__ __device__ constexpr int64_t amax_chunk() {
  return int64_t{kThreads} * kAmaxLoads * kPerLoad<T>;
}

// m = max(m, |activate<kAct>(v[k], p[k])| bits) over k. With an activation, a warp evaluates
// element k only when some lane's activation_bound exceeds that lane's m (a vote, so that the
// whole warp skips the work); a skipped value is at most its lane's m, which is itself the
// magnitude of an evaluated value, so the maximum is the same as with every value evaluated.
// Every lane of the warp calls it.
template <CastActivation kAct, int N>
__device__ __forceinline__ void max_activated(const float (&v)[N], const float (&p)[N],
                                              uint32_t& m) {
#pragma unroll
  for (int k = 0; k < N; ++k) {
    if constexpr (kAct == CastActivation::kNone) {
      m = max(m, abs_bits(v[k]));
    } else if (__any_sync(0xFFFFFFFFu, activation_bound<kAct>(v[k], p[k]) > m)) {
      m = max(m, abs_bits(activate<kAct>(v[k], p[k])));
    }
  }
}

// A grid of resident blocks strides over in[0, n) (and pre for kDgelu) in steps of
// amax_chunk<T>() elements: each thread issues kAmaxLoads 16-byte loads of each input (lane-
// contiguous: a warp's load covers 512 consecutive bytes) before it uses them, then the warp
// shares its running maximum, so that a lane skips what any lane of the warp has exceeded.
// `vec`: in and pre are 16-byte aligned. One atomicMax per block.
template <class T, CastActivation kAct>
__global__ void __launch_bounds__(kThreads)
    amax_kernel(const T* in, const T* pre, int64_t n, bool vec, float* amax) {
  uint32_t m = 0;
  // The loop's bounds are the same for the whole block, so the votes see every lane.
  for (int64_t base = int64_t(blockIdx.x) * amax_chunk<T>(); base < n;
       base += int64_t(gridDim.x) * amax_chunk<T>()) {
    float v[kAmaxLoads][kPerLoad<T>], p[kAmaxLoads][kPerLoad<T>] = {};
#pragma unroll
    for (int u = 0; u < kAmaxLoads; ++u) {
      const int64_t i = base + (int64_t{u} * kThreads + threadIdx.x) * kPerLoad<T>;
      load_vec(in, i, n, vec, v[u]);
      if constexpr (kAct == CastActivation::kDgelu) load_vec(pre, i, n, vec, p[u]);
    }
#pragma unroll
    for (int u = 0; u < kAmaxLoads; ++u) max_activated<kAct>(v[u], p[u], m);
    if constexpr (kAct != CastActivation::kNone) m = __reduce_max_sync(0xFFFFFFFFu, m);
  }
  block_amax<kThreads>(m, amax);
}

// ---- tiled kernel: cast_transpose / dbias_quantize -----------------------------------------

struct TileParams {
  const void* in;
  const void* pre;  // CastActivation::kDgelu
  uint8_t* out;
  uint8_t* out_t;   // null: no columnwise copy
  float* partials;  // null: no dbias; else fp32 [row_tiles, cols] column sums per row tile
  const float* scale;
  float* scale_inv;
  float* amax;
  int64_t rows;
  int64_t cols;
  bool vec;  // 16-byte accesses are legal (aligned pointers, rows and cols multiples of 16)
};

// A tile is kTileRows x kTileCols elements. Thread (lr = tid / 4, seg = tid % 4) loads the
// 16 columns seg * 16.. of rows lr and lr + 64: its loads of both rows (8 x 16 bytes for fp32)
// are issued before any is used. Shared memory holds the tile's codes row-major, 64 bytes per
// row, without padding: the rowwise phase writes 16-byte vectors whose quarter-warp phases
// cover 128 contiguous bytes, and the transposed phase has the 32 lanes of a warp read 32
// consecutive bytes of one row (8 words, each broadcast to 4 lanes); both are free of bank
// conflicts. In the transposed phase thread (oc = tid % 64, part = tid / 64) writes bytes
// part * 32.. of columnwise row c0 + oc: two 16-byte stores into one whole 32-byte sector.
// The tile's codes and the column sums alternate between two shared buffers from tile to tile,
// so one barrier per tile suffices (between writing a buffer and reading it): a buffer is
// written again two tiles later, by threads that have passed the next tile's barrier, which
// every thread reaches only after it has read the buffer. A warp that is done with a tile goes
// on to the next tile's loads while others still store.
template <class T, __nv_fp8_interpretation_t kFmt, CastActivation kAct>
__global__ void __launch_bounds__(kThreads) cast_tiled_kernel(TileParams p) {
  __shared__ alignas(16) uint8_t tiles_buf[2][kTileRows][kTileCols];
  __shared__ float warp_sums_buf[2][kWarps][kTileCols];
  const T* in = static_cast<const T*>(p.in);
  const T* pre = static_cast<const T*>(p.pre);
  const float scale = *p.scale;
  const int64_t tiles_c = (p.cols + kTileCols - 1) / kTileCols;
  const int64_t tiles = (p.rows + kTileRows - 1) / kTileRows * tiles_c;
  const int lr = threadIdx.x / 4, seg = threadIdx.x % 4;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  uint32_t m = 0;
  int buf = 0;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x, buf ^= 1) {
    uint8_t(&tile)[kTileRows][kTileCols] = tiles_buf[buf];
    float(&warp_sums)[kWarps][kTileCols] = warp_sums_buf[buf];
    const int64_t r0 = t / tiles_c * kTileRows, c0 = t % tiles_c * kTileCols;
    const int64_t c = c0 + seg * kVec;
    float v[kRowsPerThread][kVec];
#pragma unroll
    for (int h = 0; h < kRowsPerThread; ++h) {
      const int64_t r = r0 + lr + h * kRowStep;
      if (r < p.rows) {
        load_vec(in + r * p.cols, c, p.cols, p.vec, v[h]);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) v[h][k] = 0.0f;
      }
    }
#pragma unroll
    for (int h = 0; h < kRowsPerThread; ++h) {
      const int64_t r = r0 + lr + h * kRowStep;
      if (r < p.rows) activate_vec<kAct>(pre, r * p.cols, c, p.cols, p.vec, v[h]);
      alignas(16) uint8_t codes[kVec];
      encode_vec<kFmt>(v[h], scale, codes);
#pragma unroll
      for (int k = 0; k < kVec; ++k) m = max(m, abs_bits(v[h][k]));
      if (r < p.rows) store_vec(p.out + r * p.cols, c, p.cols, p.vec, codes);
      if (p.out_t)
        *reinterpret_cast<uint4*>(&tile[lr + h * kRowStep][seg * kVec]) =
            *reinterpret_cast<const uint4*>(codes);
    }
    if (p.partials) {
      // Lanes with the same segment differ in lane bits 2..4: three shuffles sum 8 threads'
      // pairs of rows.
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        float s = v[0][k] + v[1][k];
        s += __shfl_xor_sync(0xFFFFFFFFu, s, 4);
        s += __shfl_xor_sync(0xFFFFFFFFu, s, 8);
        s += __shfl_xor_sync(0xFFFFFFFFu, s, 16);
        if (lane < 4) warp_sums[warp][lane * kVec + k] = s;
      }
    }
    __syncthreads();
    if (p.out_t) {
      const int oc = threadIdx.x % kTileCols, part = threadIdx.x / kTileCols;
      if (c0 + oc < p.cols) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int row = part * 2 * kVec + half * kVec;
          alignas(16) uint8_t col[kVec];
#pragma unroll
          for (int k = 0; k < kVec; ++k) col[k] = tile[row + k][oc];
          store_vec(p.out_t + (c0 + oc) * p.rows, r0 + row, p.rows, p.vec, col);
        }
      }
    }
    if (p.partials && threadIdx.x < kTileCols && c0 + threadIdx.x < p.cols) {
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) s += warp_sums[w][threadIdx.x];
      p.partials[r0 / kTileRows * p.cols + c0 + threadIdx.x] = s;
    }
  }
  block_amax<kThreads>(m, p.amax);
  if (blockIdx.x == 0 && threadIdx.x == 0) *p.scale_inv = 1.0f / scale;
}

// dbias[c] = ((0 + partials[0, c]) + partials[1, c]) + ... over the row tiles (deterministic).
__global__ void sum_partials_kernel(const float* partials, int64_t row_tiles, int64_t cols,
                                    float* dbias) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t t = 0; t < row_tiles; ++t) s += partials[t * cols + c];
  dbias[c] = s;
}

__global__ void zero_scalar_kernel(float* amax) { *amax = 0.0f; }

// ---- dequantize ----------------------------------------------------------------------------

template <class T, __nv_fp8_interpretation_t kFmt>
__global__ void dequantize_kernel(const uint8_t* in, const float* scale_inv, T* out, int64_t n) {
  const float s = *scale_inv;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    store_float(out + i, decode_fp8<kFmt>(in[i]) * s);
  }
}

// ---- dispatch ------------------------------------------------------------------------------

template <CastActivation kAct>
struct ActTag {
  static constexpr CastActivation value = kAct;
};

// Calls f(TypeTag<T>, FmtTag<fmt>, ActTag<act>) for the cast's spec.
template <class F>
void dispatch(const CastSpec& spec, F&& f) {
  dispatch_dtypes(spec.in_dtype, spec.fp8, [&](auto type, auto fmt) {
    switch (spec.activation) {
      case CastActivation::kNone:
        return f(type, fmt, ActTag<CastActivation::kNone>{});
      case CastActivation::kGelu:
        return f(type, fmt, ActTag<CastActivation::kGelu>{});
      case CastActivation::kDgelu:
        return f(type, fmt, ActTag<CastActivation::kDgelu>{});
    }
  });
}

int multiprocessors() {
  int device = 0, sms = 0;
  QMESH_CHECK_CUDA(cudaGetDevice(&device));
  QMESH_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return sms;
}

// The blocks of `kernel` (kThreads threads) that the current device holds at once: a grid of
// persistent blocks sized by the kernel's real occupancy (registers and shared memory), not
// by the thread limit alone. The per-SM count is asked once per kernel.
template <class Kernel>
int resident_blocks(Kernel* kernel) {
  static std::mutex mutex;
  static std::map<const void*, int> per_sm;
  const std::lock_guard lock(mutex);
  auto [it, added] = per_sm.try_emplace(reinterpret_cast<const void*>(kernel), 1);
  if (added) {
    int blocks = 0;
    QMESH_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, kThreads, 0));
    it->second = std::max(blocks, 1);
  }
  return multiprocessors() * it->second;
}

void cast_flat(const CastSpec& spec, std::span<const CastJob> jobs, cudaStream_t stream) {
  FlatParams p{};
  int64_t blocks = 0;
  bool any_replace = false;
  for (const CastJob& job : jobs) {
    const int64_t n = job.rows * job.cols;
    const bool replace = job.amax_update == AmaxUpdate::kReplace;
    any_replace = any_replace || replace;
    p.groups[p.count++] = {job.in,   job.pre, job.out, job.scale, job.scale_inv,
                           job.amax, replace, n,       blocks};
    blocks += std::max<int64_t>(1, (n + kFlatChunk - 1) / kFlatChunk);
  }
  QMESH_CHECK(blocks < (int64_t{1} << 31), "CUDA cast of ", blocks, " blocks is too large");
  if (any_replace) {
    zero_amax_kernel<<<1, kMaxGroups, 0, stream>>>(p);
    QMESH_CHECK_CUDA(cudaGetLastError());
  }
  dispatch(spec, [&](auto type, auto fmt, auto act) {
    cast_flat_kernel<typename decltype(type)::type, decltype(fmt)::value, decltype(act)::value>
        <<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(p);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

// A job without outputs: *amax = max |activate(in)| (replaced or running, per the job).
void cast_amax(const CastSpec& spec, const CastJob& job, cudaStream_t stream) {
  if (job.amax_update == AmaxUpdate::kReplace) {
    zero_scalar_kernel<<<1, 1, 0, stream>>>(job.amax);
    QMESH_CHECK_CUDA(cudaGetLastError());
  }
  const int64_t n = job.rows * job.cols;
  if (n == 0) return;  // a grid of size 0 is an error
  const bool vec = aligned16(job.in) && aligned16(job.pre);
  dispatch(spec, [&](auto type, auto, auto act) {
    using T = typename decltype(type)::type;
    const auto kernel = amax_kernel<T, decltype(act)::value>;
    const auto grid = static_cast<unsigned>(
        std::min<int64_t>((n + amax_chunk<T>() - 1) / amax_chunk<T>(), resident_blocks(kernel)));
    kernel<<<grid, kThreads, 0, stream>>>(static_cast<const T*>(job.in),
                                          static_cast<const T*>(job.pre), n, vec, job.amax);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void cast_tiled(const CastSpec& spec, const CastJob& job, cudaStream_t stream) {
  const int64_t row_tiles = (job.rows + kTileRows - 1) / kTileRows;
  const int64_t tiles = row_tiles * ((job.cols + kTileCols - 1) / kTileCols);
  TileParams p{job.in,        job.pre,  job.out,  job.out_t, nullptr, job.scale,
               job.scale_inv, job.amax, job.rows, job.cols,  false};
  p.vec = aligned16(job.in) && aligned16(job.pre) && aligned16(job.out) &&
          (!job.out_t || aligned16(job.out_t)) && job.rows % kVec == 0 && job.cols % kVec == 0;
  if (job.amax_update == AmaxUpdate::kReplace) {
    zero_scalar_kernel<<<1, 1, 0, stream>>>(job.amax);
    QMESH_CHECK_CUDA(cudaGetLastError());
  }
  // An empty job (an empty group of grouped_quantize) launches nothing: a grid of size 0 is
  // an error. Its column sums are zeros.
  if (tiles == 0) {
    if (job.dbias && job.cols > 0)
      QMESH_CHECK_CUDA(cudaMemsetAsync(job.dbias, 0, size_t(job.cols) * sizeof(float), stream));
    return;
  }
  std::optional<StreamScratch<float>> scratch;
  if (job.dbias) p.partials = scratch.emplace(size_t(row_tiles * job.cols), stream).get();
  dispatch(spec, [&](auto type, auto fmt, auto act) {
    const auto kernel = cast_tiled_kernel<typename decltype(type)::type, decltype(fmt)::value,
                                          decltype(act)::value>;
    const auto grid = static_cast<unsigned>(std::min<int64_t>(tiles, resident_blocks(kernel)));
    kernel<<<grid, kThreads, 0, stream>>>(p);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
  if (p.partials) sum_tile_partials(p.partials, row_tiles, job.cols, job.dbias, stream);
}

}  // namespace

void sum_tile_partials(const float* partials, int64_t row_tiles, int64_t cols, float* dbias,
                       cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>((cols + kThreads - 1) / kThreads);
  sum_partials_kernel<<<blocks, kThreads, 0, stream>>>(partials, row_tiles, cols, dbias);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void cast(int device, const CastSpec& spec, std::span<const CastJob> jobs, Stream stream) {
  const DeviceGuard guard(device);
  for (const CastJob& job : jobs) {
    require_device_scalar(job.scale, device, "the FP8 output's scale");
    require_device_scalar(job.scale_inv, device, "the FP8 output's scale_inv");
    require_device_scalar(job.amax, device, "amax");
  }
  auto s = static_cast<cudaStream_t>(stream.handle);
  // A transposed output or column sums need the 2-D tiles: one launch per such job. A job
  // without outputs (an amax) runs the amax kernel. The others share flat launches, up to
  // kMaxGroups jobs each.
  std::vector<CastJob> flat;
  for (const CastJob& job : jobs) {
    if (job.out_t || job.dbias)
      cast_tiled(spec, job, s);
    else if (!job.out)
      cast_amax(spec, job, s);
    else
      flat.push_back(job);
  }
  const std::span<const CastJob> rest(flat);
  for (size_t first = 0; first < rest.size(); first += kMaxGroups)
    cast_flat(spec, rest.subspan(first, std::min<size_t>(kMaxGroups, rest.size() - first)), s);
}

void dequantize(int device, const uint8_t* in, DType fp8, const float* scale_inv, void* out,
                DType out_dtype, int64_t n, Stream stream) {
  const DeviceGuard guard(device);
  require_device_scalar(scale_inv, device, "the dequantize input's scale_inv");
  if (n == 0) return;  // a grid of size 0 is an error
  auto s = static_cast<cudaStream_t>(stream.handle);
  dispatch_dtypes(out_dtype, fp8, [&](auto type, auto fmt) {
    using T = typename decltype(type)::type;
    const auto kernel = dequantize_kernel<T, decltype(fmt)::value>;
    const auto blocks = static_cast<unsigned>(
        std::min<int64_t>((n + kThreads - 1) / kThreads, resident_blocks(kernel)));
    kernel<<<blocks, kThreads, 0, s>>>(in, scale_inv, static_cast<T*>(out), n);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
