// CUDA kernel of norm_forward (ops/norm_forward.h): LayerNorm or RMSNorm of a tile of
// kTileRows rows per block of kNormLanes threads, fused with the FP8 cast of the normalised
// rows, their columnwise copy and the amax.
//
// Statistics: warp w takes rows w, w + kWarps, ... of the tile. Lane l keeps the partial sums
// of the kernel's lanes l, l + 32, ..., l + 224 (lane t adds columns t, t + kNormLanes, ...
// in order), each group of 32 lanes is combined by the shuffle tree of block_sum and the
// group sums are added in order from 0: the order of docs/numerics.md "Norms", which
// cpu/norm.cpp reproduces. A warp reads its row twice (mean, squared deviations) back to back.
// Output: thread t takes column c0 + t of every row of the tile, c0 = 0, kNormLanes, ...; it
// reads gamma and beta once for the tile and converts the column 16 rows at a time (the 16
// loads issued before any is used), each 16 codes of the columnwise copy written as one
// 16-byte store: the thread fills the tile's whole 32-byte sector of that copy's row (element
// stores where rows % 16 != 0, out_t is not 16-byte aligned, or past the last row).
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
constexpr int kWarps = kThreads / 32;
constexpr int kTileRows = 2 * kCodeVec;  // one 32-byte sector of the columnwise copy
static_assert(kThreads % 32 == 0, "the lanes of a row are whole warps");

// sum over the row of f(x[c]) in the order of block_sum<kThreads> over lanes that each add
// columns lane, lane + kThreads, ...; called by all 32 lanes of a warp, returned to each
// (the shuffle tree's additions are commutative pairs, so every lane gets the same bits).
template <class X, class F>
__device__ float row_sum(const X* xr, int64_t cols, F f) {
  using namespace gelu_detail;
  const int lane = threadIdx.x % 32;
  float part[kWarps] = {};  // part[g]: the sum of the kernel's lane g * 32 + lane
#pragma unroll 4
  for (int64_t c0 = 0; c0 < cols; c0 += kThreads) {
#pragma unroll
    for (int g = 0; g < kWarps; ++g) {
      const int64_t c = c0 + g * 32 + lane;
      if (c < cols) part[g] = add(part[g], f(load_float(xr[c])));
    }
  }
  float total = 0.0f;
#pragma unroll
  for (int g = 0; g < kWarps; ++g) {
    float v = part[g];
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
    total += v;
  }
  return total;
}

// Rows [row0, row0 + kTileRows) ∩ [0, rows) per block; block 0 also writes scale_inv. Two
// blocks per SM (at most 128 registers a thread): 8192 rows (256 blocks) run in one wave on
// an H100's 132 SMs.
template <class X, bool kRms, __nv_fp8_interpretation_t kFmt>
__global__ void __launch_bounds__(kThreads, 2) norm_kernel(NormJob p, bool vec_t) {
  using namespace gelu_detail;
  __shared__ float tile_mean[kTileRows], tile_rstd[kTileRows];
  const int64_t row0 = int64_t{blockIdx.x} * kTileRows, cols = p.cols;
  const int tile_rows = p.rows - row0 < kTileRows ? static_cast<int>(p.rows - row0) : kTileRows;
  const X* x = static_cast<const X*>(p.x);
  if (p.out != nullptr && blockIdx.x == 0 && threadIdx.x == 0)
    *p.scale_inv = __fdiv_rn(1.0f, *p.scale);

  for (int r = threadIdx.x / 32; r < tile_rows; r += kWarps) {
    const X* xr = x + (row0 + r) * cols;
    float mean = 0.0f;
    if constexpr (!kRms) mean = div(row_sum(xr, cols, [](float v) { return v; }), float(cols));
    const float sq = row_sum(xr, cols, [mean](float v) {
      const float d = kRms ? v : sub(v, mean);
      return mul(d, d);
    });
    const float rstd = norm_rstd(sq, cols, p.eps);
    if (threadIdx.x % 32 == 0) {
      tile_mean[r] = mean;
      tile_rstd[r] = rstd;
      if (p.mean != nullptr) p.mean[row0 + r] = canonical_nan(mean);
      if (p.rstd != nullptr) p.rstd[row0 + r] = canonical_nan(rstd);
    }
  }
  __syncthreads();

  uint32_t amax = 0;
  const float scale = p.out != nullptr ? *p.scale : 0.0f;
  const bool y_bf16 = p.y_dtype == DType::kBFloat16;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const float g = p.zero_centered_gamma ? add(p.gamma[c], 1.0f) : p.gamma[c];
    const float b = kRms ? 0.0f : p.beta[c];
    // Rows r0.. of the tile, one 16-byte store of the columnwise copy at a time.
#pragma unroll 1
    for (int r0 = 0; r0 < kTileRows; r0 += kCodeVec) {
      float xv[kCodeVec];
#pragma unroll
      for (int k = 0; k < kCodeVec; ++k)
        if (r0 + k < tile_rows) xv[k] = load_float(x[(row0 + r0 + k) * cols + c]);
      alignas(16) uint8_t codes[kCodeVec] = {};
#pragma unroll
      for (int k = 0; k < kCodeVec; ++k) {
        const int r = r0 + k;
        if (r >= tile_rows) break;
        float v = canonical_nan(normalize(xv[k], tile_mean[r], tile_rstd[r], g, b, kRms));
        const int64_t i = (row0 + r) * cols + c;
        if (y_bf16) {
          const __nv_bfloat16 h = __float2bfloat16_rn(v);
          v = __bfloat162float(h);
          if (p.y != nullptr) static_cast<__nv_bfloat16*>(p.y)[i] = h;
        } else if (p.y != nullptr) {
          static_cast<float*>(p.y)[i] = v;
        }
        amax = max(amax, abs_bits(v));
        if (p.out != nullptr) {
          codes[k] =
              static_cast<uint8_t>(__nv_cvt_float_to_fp8(mul(v, scale), __NV_SATFINITE, kFmt));
          p.out[i] = codes[k];
        }
      }
      if (p.out != nullptr && p.out_t != nullptr)
        store_vec(p.out_t + c * p.rows, row0 + r0, p.rows, vec_t, codes);
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
  dispatch_dtypes(job.x_dtype, job.fp8, [&](auto type, auto fmt) {
    using X = typename decltype(type)::type;
    if (job.beta == nullptr)
      norm_kernel<X, true, decltype(fmt)::value><<<blocks, kThreads, 0, s>>>(job, vec_t);
    else
      norm_kernel<X, false, decltype(fmt)::value><<<blocks, kThreads, 0, s>>>(job, vec_t);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
