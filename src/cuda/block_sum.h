// Block-wide sum for CUDA kernels (internal).
#pragma once

namespace qmesh::detail::cuda {

// The sum of `v` over a block of kBlockThreads threads (a multiple of 32), returned to every
// thread. Every thread of the block must call it. `scratch`: kBlockThreads / 32 elements of
// shared memory, reusable by the next call. The order of the additions is fixed, so the
// result is the same on every run.
template <int kBlockThreads, class T>
__device__ T block_sum(T v, T* scratch) {
  static_assert(kBlockThreads % 32 == 0, "whole warps only");
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  __syncthreads();  // scratch may still be read by a previous call
  if (threadIdx.x % 32 == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  T total = 0;
  for (int w = 0; w < kBlockThreads / 32; ++w) total += scratch[w];
  return total;
}

}  // namespace qmesh::detail::cuda
