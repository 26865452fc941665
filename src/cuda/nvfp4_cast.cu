// CUDA backend of the NVFP4 casts (ops/nvfp4_quantize.h); cpu/nvfp4_cast.cpp is its host twin.
// Both evaluate the block steps of ops/nvfp4_cast_job.h (the rules of ops/nvfp4_rules.h, which
// round on integer bits, with no E2M1 instructions: runs on Hopper), so the bits match.
//
// Per copy, one thread per 16-element block, three launches on `stream`:
//   1. block amaxes into scratch, and their max into the per-tensor amax (atomicMax on the
//      bits of |x|: a NaN sorts above infinity and propagates);
//   2. (nothing to launch: with 16x16 tiles, step 3 takes the max of the tile's 16 block
//      amaxes);
//   3. scales and codes, from the per-tensor amax read back on the device.
// An amax-only job (nvfp4_amax) runs step 1 alone, into its output.
// A straightforward first kernel: each block is read twice (columnwise: strided reads).
#include <algorithm>
#include <cstdint>

#include "cuda/cast_elements.cuh"
#include "cuda/nvfp4_cast.h"
#include "cuda/stream_scratch.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"

namespace qmesh::detail::cuda {

namespace {

using nvfp4::kBlock;

constexpr int kThreads = 256;

template <class T>
struct DeviceLoad {
  const T* in;
  __device__ float operator()(int64_t k) const { return load_float(in[k]); }
};

unsigned grid_for(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 1 << 20));
}

template <class T>
__global__ void block_amax_kernel(NvFp4CastJob job, int copy, uint32_t* block_amax,
                                  uint32_t* global_amax) {
  const int64_t blocks = job.copy_cols(copy) / kBlock, n = job.copy_rows(copy) * blocks;
  const DeviceLoad<T> load{static_cast<const T*>(job.in)};
  uint32_t local = 0;
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < n;
       b += int64_t(gridDim.x) * blockDim.x) {
    float v[kBlock];
    nvfp4::load_block(job, load, copy, b / blocks, b % blocks, v);
    const uint32_t a = nvfp4::amax_bits(v);
    if (block_amax) block_amax[b] = a;
    local = max(local, a);
  }
  atomicMax(global_amax, local);
}

template <class T>
__global__ void encode_kernel(NvFp4CastJob job, int copy, const uint32_t* block_amax,
                              const uint32_t* global_amax) {
  const int64_t blocks = job.copy_cols(copy) / kBlock, n = job.copy_rows(copy) * blocks;
  const DeviceLoad<T> load{static_cast<const T*>(job.in)};
  const float tensor_amax = job.tensor_amax(copy, __uint_as_float(*global_amax));
  const float global_encode = nvfp4::global_encode_scale(tensor_amax);
  const float global_decode = 1.0f / global_encode;
  const NvFp4Rounding rounding = job.rounding();
  if (blockIdx.x == 0 && threadIdx.x == 0)
    *job.copies[copy].scale_inv = nvfp4::stored_decode_scale(tensor_amax, global_encode);
  for (int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; b < n;
       b += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = b / blocks, kb = b % blocks;
    uint32_t amax = block_amax[b];
    if (job.tiles_2d) {
      const int64_t i0 = i / kBlock * kBlock;
      for (int64_t r = i0; r < i0 + kBlock; ++r) amax = max(amax, block_amax[r * blocks + kb]);
    }
    float v[kBlock];
    nvfp4::load_block(job, load, copy, i, kb, v);
    nvfp4::encode_block(job, copy, i, kb, v, __uint_as_float(amax), global_encode, global_decode,
                        rounding);
  }
}

template <class T>
__global__ void dequantize_kernel(const uint8_t* data, const uint8_t* scale, const float* scale_inv,
                                  int64_t rows, int64_t cols, T* out) {
  const int64_t n = rows * cols;
  const float global_decode = *scale_inv;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = e / cols, j = e % cols;
    store_float(out + e, nvfp4::decode_element(data + i * (cols / 2), scale + i * (cols / kBlock),
                                               j, global_decode));
  }
}

// Calls f(TypeTag<T>) for a wide dtype (fp32, bf16 or fp16).
template <class F>
void dispatch_wide(DType wide, F&& f) {
  dispatch_dtypes(wide, DType::kFloat8E4M3, [&](auto type, auto) { f(type); });
}

}  // namespace

void nvfp4_cast(int device, const NvFp4CastJob& job, Stream stream) {
  const DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream.handle);
  const int64_t n = job.rows * job.cols / kBlock;  // blocks per copy
  // An amax-only job reduces straight into job.amax_out (a float's bits order as its
  // magnitude's for a non-negative float) and keeps no block amaxes.
  StreamScratch<uint32_t> scratch(job.amax_out ? 1 : size_t(n + 1), s);
  uint32_t* block_amax = job.amax_out ? nullptr : scratch.get();
  dispatch_wide(job.in_dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    for (int copy = 0; copy < 2; ++copy) {
      if (!job.has_copy(copy)) continue;
      uint32_t* global_amax =
          job.amax_out ? reinterpret_cast<uint32_t*>(job.amax_out + copy) : scratch.get() + n;
      QMESH_CHECK_CUDA(cudaMemsetAsync(global_amax, 0, sizeof(uint32_t), s));
      block_amax_kernel<T><<<grid_for(n), kThreads, 0, s>>>(job, copy, block_amax, global_amax);
      QMESH_CHECK_CUDA(cudaGetLastError());
      if (job.amax_out) continue;
      encode_kernel<T><<<grid_for(n), kThreads, 0, s>>>(job, copy, block_amax, global_amax);
      QMESH_CHECK_CUDA(cudaGetLastError());
    }
  });
  if (job.amax_out && !job.rht_columnwise)
    QMESH_CHECK_CUDA(cudaMemcpyAsync(job.amax_out + 1, job.amax_out, sizeof(float),
                                     cudaMemcpyDeviceToDevice, s));
}

void nvfp4_dequantize(int device, const uint8_t* data, const uint8_t* scale, const float* scale_inv,
                      int64_t rows, int64_t cols, void* out, DType out_dtype, Stream stream) {
  const DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream.handle);
  dispatch_wide(out_dtype, [&](auto type) {
    using T = typename decltype(type)::type;
    dequantize_kernel<T><<<grid_for(rows * cols), kThreads, 0, s>>>(data, scale, scale_inv, rows,
                                                                    cols, static_cast<T*>(out));
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
