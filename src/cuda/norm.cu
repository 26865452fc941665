// CUDA kernel of norm_forward (ops/norm_forward.h): LayerNorm or RMSNorm of a tile of
// kTileRows rows per block of kNormLanes threads, one row at a time, fused with the FP8 cast
// of the normalised rows, their columnwise copy and the amax; x is read from memory once.
//
// Thread t holds the row's columns t, t + kNormLanes, ... (kValues of them, a chunk of
// kChunk columns) in registers. Its partial sums add them in column order, block_sum combines
// each warp's 32 lanes by the xor-shuffle tree and adds the 8 warp sums in order from 0: the
// order of docs/numerics.md "Norms", which cpu/norm.cpp reproduces. The squared deviations
// and the output are computed from the registers. A row wider than kChunk is taken chunk by
// chunk in each of the three passes (mean, squared deviations, output), re-read from L1/L2.
// Output: y and the rowwise codes are stored from the registers (each warp store covers 32
// consecutive columns); the codes of the tile are staged in shared memory, kTileRows x cols
// bytes, and the columnwise copy is written from there after the tile, thread t taking
// columns t, t + kNormLanes, ...: one 16-byte store of the tile's 16 rows of a column
// (element stores where rows % 16 != 0, out_t is not 16-byte aligned, or past the last row).
// Rows too wide to stage (over kMaxStagedBytes) write the columnwise codes one by one.
// Every operation of ops/norm_job.h is rounded as written (__fmul_rn / __fadd_rn, never
// contracted), the codes come from the same saturating round-to-nearest-even conversion as
// the casts (cuda/cast.cu), and the amax is block_amax's atomicMax on the float's bits.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/block_sum.h"
#include "cuda/cast_elements.cuh"
#include "cuda/norm.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"

namespace qmesh::detail::cuda {

namespace {

constexpr int kThreads = kNormLanes;
constexpr int kTileRows = kCodeVec;  // one 16-byte store of the columnwise copy per column
constexpr int kValues = 32;          // columns a thread holds in registers
constexpr int64_t kChunk = int64_t{kValues} * kThreads;
constexpr int64_t kMaxStagedBytes = kTileRows * kChunk;  // 128 KB: rows up to kChunk columns
static_assert(kThreads % 32 == 0, "the lanes of a row are whole warps");

// Loads the first min(kValues, ceil(left / kThreads)) of the columns xc[j * kThreads] (a chunk
// of the thread's columns, `left` columns of the row from xc on) into v[j]; the others stay.
template <class X>
__device__ __forceinline__ void load_chunk(const X* xc, int64_t left, float (&v)[kValues]) {
#pragma unroll
  for (int j = 0; j < kValues; ++j)
    if (j * kThreads < left) v[j] = load_float(xc[j * kThreads]);
}

// The sum over the row of f(x[c]) in the order of docs/numerics.md "Norms", returned to every
// thread of the block (all of them call it): the thread's columns threadIdx.x + k * kThreads
// in column order, chunk by chunk, then block_sum. Each chunk is loaded into v unless
// `loaded` (the row is one chunk, already in v).
template <class X, class F>
__device__ __forceinline__ float row_sum(const X* xr, int64_t cols, bool loaded,
                                         float (&v)[kValues], float* scratch, F f) {
  using namespace gelu_detail;
  float part = 0.0f;
  for (int64_t base = threadIdx.x; base < cols; base += kChunk) {
    const int64_t left = cols - base;
    if (!loaded) load_chunk(xr + base, left, v);
#pragma unroll
    for (int j = 0; j < kValues; ++j)
      if (j * kThreads < left) part = add(part, f(v[j]));
  }
  return block_sum<kThreads>(part, scratch);
}

// Rows [row0, row0 + kTileRows) ∩ [0, rows) per block, one at a time; block 0 also writes
// scale_inv. `staged` (dynamic shared memory, kTileRows * cols bytes) is used when `stage`
// (out_t is written and the tile fits).
template <class X, bool kRms, __nv_fp8_interpretation_t kFmt>
__global__ void __launch_bounds__(kThreads, 4) norm_kernel(NormJob p, bool vec_t, bool stage) {
  using namespace gelu_detail;
  extern __shared__ uint8_t staged[];  // [kTileRows, cols]: the tile's codes
  __shared__ float scratch[kThreads / 32];
  const int64_t row0 = int64_t{blockIdx.x} * kTileRows, cols = p.cols;
  const int tile_rows = p.rows - row0 < kTileRows ? static_cast<int>(p.rows - row0) : kTileRows;
  const bool resident = cols <= kChunk;
  const X* x = static_cast<const X*>(p.x);
  if (p.out != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    *p.scale_inv = __fdiv_rn(1.0f, *p.scale);

  uint32_t amax = 0;
  const float scale = p.out != nullptr ? *p.scale : 0.0f;
  const bool y_bf16 = p.y_dtype == DType::kBFloat16;
#pragma unroll 1
  for (int r = 0; r < tile_rows; ++r) {
    const int64_t row = row0 + r;
    const X* xr = x + row * cols;
    float v[kValues];
    float mean = 0.0f;
    if constexpr (!kRms)
      mean = div(row_sum(xr, cols, false, v, scratch, [](float xv) { return xv; }), float(cols));
    const float sq = row_sum(xr, cols, !kRms && resident, v, scratch, [mean](float xv) {
      const float d = kRms ? xv : sub(xv, mean);
      return mul(d, d);
    });
    const float rstd = norm_rstd(sq, cols, p.eps);
    if (threadIdx.x == 0) {
      if (p.mean != nullptr) p.mean[row] = canonical_nan(mean);
      if (p.rstd != nullptr) p.rstd[row] = canonical_nan(rstd);
    }

    // Output, chunk by chunk: normalised in place first, so that no store comes between the
    // loads of gamma and beta, then stored.
    for (int64_t base = threadIdx.x; base < cols; base += kChunk) {
      const int64_t left = cols - base;  // columns from this chunk's first on
      if (!resident) load_chunk(xr + base, left, v);
#pragma unroll
      for (int j = 0; j < kValues; ++j) {
        if (j * kThreads >= left) break;
        const float gj = p.gamma[base + j * kThreads];
        const float g = p.zero_centered_gamma ? add(gj, 1.0f) : gj;
        const float b = kRms ? 0.0f : p.beta[base + j * kThreads];
        v[j] = canonical_nan(normalize(v[j], mean, rstd, g, b, kRms));
      }
      const int64_t i0 = row * cols + base;
#pragma unroll
      for (int j = 0; j < kValues; ++j) {
        if (j * kThreads >= left) break;
        const int64_t i = i0 + j * kThreads;
        float y = v[j];
        if (y_bf16) {
          const __nv_bfloat16 h = __float2bfloat16_rn(y);
          y = __bfloat162float(h);
          if (p.y != nullptr) static_cast<__nv_bfloat16*>(p.y)[i] = h;
        } else if (p.y != nullptr) {
          static_cast<float*>(p.y)[i] = y;
        }
        amax = max(amax, abs_bits(y));
        if (p.out != nullptr) {
          const auto code =
              static_cast<uint8_t>(__nv_cvt_float_to_fp8(mul(y, scale), __NV_SATFINITE, kFmt));
          p.out[i] = code;
          if (stage)
            staged[r * cols + base + j * kThreads] = code;
          else if (p.out_t != nullptr)
            p.out_t[(base + j * kThreads) * p.rows + row] = code;
        }
      }
    }
  }

  if (stage) {
    __syncthreads();  // every row of the tile staged
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      alignas(16) uint8_t codes[kCodeVec] = {};
#pragma unroll
      for (int k = 0; k < kCodeVec; ++k)
        if (k < tile_rows) codes[k] = staged[k * cols + c];
      store_vec(p.out_t + c * p.rows, row0, p.rows, vec_t, codes);
    }
  }
  if (p.amax != nullptr) block_amax<kThreads>(amax, p.amax);
}

}  // namespace

void norm_forward(int device, const NormJob& job, Stream stream) {
  const DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream.handle);
  if (job.amax != nullptr && job.out == nullptr)  // a replaced amax: the kernel takes a max
    QMESH_CHECK_CUDA(cudaMemsetAsync(job.amax, 0, sizeof(float), s));
  const auto blocks = static_cast<unsigned>((job.rows + kTileRows - 1) / kTileRows);
  const bool vec_t = job.out_t != nullptr && aligned16(job.out_t) && job.rows % kCodeVec == 0;
  const int64_t staged_bytes = kTileRows * job.cols;
  const bool stage = job.out != nullptr && job.out_t != nullptr && staged_bytes <= kMaxStagedBytes;
  const auto smem = static_cast<int>(stage ? staged_bytes : 0);
  dispatch_dtypes(job.x_dtype, job.fp8, [&](auto type, auto fmt) {
    using X = typename decltype(type)::type;
    const auto kernel = job.beta == nullptr ? norm_kernel<X, true, decltype(fmt)::value>
                                            : norm_kernel<X, false, decltype(fmt)::value>;
    // The same limit on every call (the launch's own size sets the occupancy): no call lowers
    // it under another thread's launch.
    QMESH_CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kMaxStagedBytes)));
    kernel<<<blocks, kThreads, smem, s>>>(job, vec_t, stage);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
