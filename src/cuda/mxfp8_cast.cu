// CUDA backend of the MXFP8 casts (ops/mxfp8_quantize.h); cpu/mxfp8_cast.cpp is its host
// twin, bit for bit. Runs on every architecture qmesh builds for (no Blackwell instruction).
//
// One warp per 32 x 32 tile of x, four warps per thread block. Lane j holds column c0 + j of
// the tile's 32 rows in registers (each row read by the warp as 32 consecutive elements):
//   - column amax (a 32x1 block): per lane, over its 32 values;
//   - row amax (a 1x32 block): one __reduce_max_sync per row; lane i keeps row i's;
//   - E8M0 bytes and multipliers: scaling/mx_scale_rule.h; row multipliers are shuffled to
//     the lanes that encode the row;
//   - rowwise codes: for each row the warp stores 32 consecutive bytes;
//   - columnwise codes: lane j stores the 32 contiguous bytes of columnwise row c0 + j (two
//     16-byte stores when aligned);
//   - dbias: lane j sums its 32 values in row order (the strip sum of ops/mxfp8_quantize.h),
//     then sum_tile_partials adds the strips in order.
#include <algorithm>
#include <cstdint>
#include <optional>

#include "cuda/cast_elements.cuh"
#include "cuda/mxfp8_cast.h"
#include "cuda/stream_scratch.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "scaling/mx_scale_rule.h"

namespace qmesh::detail::cuda {

namespace {

constexpr int kB = 32;
constexpr int kWarpsPerBlock = 4;
constexpr int kThreads = kB * kWarpsPerBlock;

struct MxParams {
  MxCastJob job;
  float* partials;  // null: no dbias; else fp32 [rows / 32, cols]
  bool vec_out_t;   // out_t 16-byte aligned (rows % 32 == 0 always)
};

template <__nv_fp8_interpretation_t kFmt>
__device__ __forceinline__ uint8_t encode(float x) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x, __NV_SATFINITE, kFmt));
}

template <class T, __nv_fp8_interpretation_t kFmt>
__global__ void __launch_bounds__(kThreads) mxfp8_cast_kernel(MxParams p) {
  const int64_t col_tiles = p.job.cols / kB;
  const int64_t tile = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kB;
  if (tile >= p.job.rows / kB * col_tiles) return;
  const int64_t rb = tile / col_tiles, cb = tile % col_tiles;
  const int64_t r0 = rb * kB, c0 = cb * kB;
  const int lane = threadIdx.x % kB;
  const T* in = static_cast<const T*>(p.job.in) + r0 * p.job.cols + c0 + lane;

  float v[kB];
  uint32_t col_amax = 0, my_row_amax = 0;
#pragma unroll
  for (int i = 0; i < kB; ++i) {
    v[i] = load_float(in[i * p.job.cols]);
    const uint32_t a = abs_bits(v[i]);
    col_amax = max(col_amax, a);
    const uint32_t row_amax = __reduce_max_sync(0xFFFFFFFFu, a);
    if (lane == i) my_row_amax = row_amax;
  }

  const uint8_t row_byte = mx_scale_byte(__uint_as_float(my_row_amax), p.job.scaled_max);
  const float row_scale = mx_scale(row_byte);
  p.job.scale[(r0 + lane) * col_tiles + cb] = row_byte;
  uint8_t* out = p.job.out + r0 * p.job.cols + c0 + lane;
#pragma unroll
  for (int i = 0; i < kB; ++i)
    out[i * p.job.cols] = encode<kFmt>(v[i] * __shfl_sync(0xFFFFFFFFu, row_scale, i));

  if (p.job.out_t) {
    const uint8_t col_byte = mx_scale_byte(__uint_as_float(col_amax), p.job.scaled_max);
    const float col_scale = mx_scale(col_byte);
    p.job.scale_t[(c0 + lane) * (p.job.rows / kB) + rb] = col_byte;
    alignas(16) uint8_t codes[kB];
#pragma unroll
    for (int i = 0; i < kB; ++i) codes[i] = encode<kFmt>(v[i] * col_scale);
    uint8_t* out_t = p.job.out_t + (c0 + lane) * p.job.rows + r0;
    if (p.vec_out_t) {
      reinterpret_cast<uint4*>(out_t)[0] = reinterpret_cast<const uint4*>(codes)[0];
      reinterpret_cast<uint4*>(out_t)[1] = reinterpret_cast<const uint4*>(codes)[1];
    } else {
#pragma unroll
      for (int i = 0; i < kB; ++i) out_t[i] = codes[i];
    }
  }

  if (p.partials) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < kB; ++i) s += v[i];
    p.partials[rb * p.job.cols + c0 + lane] = s;
  }
}

template <class T, __nv_fp8_interpretation_t kFmt>
__global__ void mxfp8_dequantize_kernel(MxDequantizeJob job) {
  const int64_t n = job.rows * job.cols;
  T* out = static_cast<T*>(job.out);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / job.cols, kb = i % job.cols / kB;
    store_float(out + i,
                decode_fp8<kFmt>(job.in[i]) * mx_scale_inv(job.scale[r * (job.cols / kB) + kb]));
  }
}

}  // namespace

void mxfp8_cast(int device, const MxCastJob& job, Stream stream) {
  const DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream.handle);
  const int64_t tiles = job.rows / kB * (job.cols / kB);
  const int64_t blocks = (tiles + kWarpsPerBlock - 1) / kWarpsPerBlock;
  QMESH_CHECK(blocks < (int64_t{1} << 31), "MXFP8 cast of a [", job.rows, ", ", job.cols,
              "] tensor needs ", blocks, " thread blocks, more than one CUDA launch holds");
  MxParams p{};
  p.job = job;
  p.vec_out_t = job.out_t && aligned16(job.out_t);
  std::optional<StreamScratch<float>> scratch;
  if (job.dbias) p.partials = scratch.emplace(size_t(job.rows / kB * job.cols), s).get();
  dispatch_dtypes(job.in_dtype, job.fp8, [&](auto type, auto fmt) {
    using T = typename decltype(type)::type;
    mxfp8_cast_kernel<T, decltype(fmt)::value>
        <<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(p);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
  if (p.partials) sum_tile_partials(p.partials, job.rows / kB, job.cols, job.dbias, s);
}

void mxfp8_dequantize(int device, const MxDequantizeJob& job, Stream stream) {
  const DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream.handle);
  const int64_t n = job.rows * job.cols;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 65536));
  dispatch_dtypes(job.out_dtype, job.fp8, [&](auto type, auto fmt) {
    using T = typename decltype(type)::type;
    mxfp8_dequantize_kernel<T, decltype(fmt)::value><<<blocks, 256, 0, s>>>(job);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
