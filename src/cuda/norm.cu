// CUDA kernel of norm_forward (ops/norm_forward.h): LayerNorm or RMSNorm of one row per block of
// kNormLanes threads, fused with the FP8 cast of the normalised row and its amax.
//
// Thread t adds columns t, t + kNormLanes, ... of its row in order; block_sum combines the
// lanes (a pairwise tree within each warp, then the warps in order), which cpu/norm.cpp
// reproduces. The row is read three times (mean, squared deviations, output): a row of a few
// thousand elements stays in L1/L2 between the passes, so DRAM sees it once. Every operation of
// ops/norm_job.h is rounded as written (__fmul_rn / __fadd_rn, never contracted), the codes come
// from the same saturating round-to-nearest-even conversion as the casts (cuda/cast.cu), and
// the amax is block_amax's atomicMax on the float's bits. The columnwise copy is written one
// byte per element at a stride of `rows`.
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

// One row per block; block 0 also writes scale_inv.
template <class X, bool kRms, __nv_fp8_interpretation_t kFmt>
__global__ void __launch_bounds__(kThreads) norm_kernel(NormJob p) {
  using namespace gelu_detail;
  __shared__ float scratch[kThreads / 32];
  const int64_t row = blockIdx.x;
  if (p.out != nullptr && row == 0 && threadIdx.x == 0) *p.scale_inv = __fdiv_rn(1.0f, *p.scale);
  uint32_t amax = 0;
  {
    const int64_t cols = p.cols;
    const X* xr = static_cast<const X*>(p.x) + row * cols;
    float mean = 0.0f;
    if constexpr (!kRms) {
      float s = 0.0f;
      for (int64_t c = threadIdx.x; c < cols; c += kThreads) s = add(s, load_float(xr[c]));
      mean = div(block_sum<kThreads>(s, scratch), float(cols));
    }
    float sq = 0.0f;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      const float v = load_float(xr[c]);
      const float d = kRms ? v : sub(v, mean);
      sq = add(sq, mul(d, d));
    }
    const float rstd = norm_rstd(block_sum<kThreads>(sq, scratch), cols, p.eps);
    const float scale = p.out != nullptr ? *p.scale : 0.0f;
    const bool y_bf16 = p.y_dtype == DType::kBFloat16;
    for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
      const float g = p.zero_centered_gamma ? add(p.gamma[c], 1.0f) : p.gamma[c];
      float v =
          canonical_nan(normalize(load_float(xr[c]), mean, rstd, g, kRms ? 0.0f : p.beta[c], kRms));
      const int64_t i = row * cols + c;
      if (y_bf16) {
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        v = __bfloat162float(h);
        if (p.y != nullptr) static_cast<__nv_bfloat16*>(p.y)[i] = h;
      } else if (p.y != nullptr) {
        static_cast<float*>(p.y)[i] = v;
      }
      amax = max(amax, abs_bits(v));
      if (p.out != nullptr) {
        const auto code =
            static_cast<uint8_t>(__nv_cvt_float_to_fp8(mul(v, scale), __NV_SATFINITE, kFmt));
        p.out[i] = code;
        if (p.out_t != nullptr) p.out_t[c * p.rows + row] = code;
      }
    }
    if (threadIdx.x == 0) {
      if (p.mean != nullptr) p.mean[row] = canonical_nan(mean);
      if (p.rstd != nullptr) p.rstd[row] = canonical_nan(rstd);
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
  const auto blocks = static_cast<unsigned>(job.rows);
  dispatch_dtypes(job.x_dtype, job.fp8, [&](auto type, auto fmt) {
    using X = typename decltype(type)::type;
    if (job.beta == nullptr)
      norm_kernel<X, true, decltype(fmt)::value><<<blocks, kThreads, 0, s>>>(job);
    else
      norm_kernel<X, false, decltype(fmt)::value><<<blocks, kThreads, 0, s>>>(job);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
