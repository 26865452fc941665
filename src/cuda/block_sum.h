// Block-wide reductions for CUDA kernels (internal): a sum, and the amax of a cast.
#pragma once

#include <cstdint>

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

// Block-wide max of m (|x| bits; every thread of the block calls it), then one atomicMax
// into *amax by thread 0: non-negative floats order like their bits and NaN sorts above +inf
// (the NaN-propagating amax of ops/amax.h).
template <int kBlockThreads>
__device__ void block_amax(uint32_t m, float* amax) {
  static_assert(kBlockThreads % 32 == 0 && kBlockThreads <= 1024, "whole warps only");
  __shared__ uint32_t warp_max[kBlockThreads / 32];
  m = __reduce_max_sync(0xFFFFFFFFu, m);
  if (threadIdx.x % 32 == 0) warp_max[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x < 32) {
    m = threadIdx.x < kBlockThreads / 32 ? warp_max[threadIdx.x] : 0u;
    m = __reduce_max_sync(0xFFFFFFFFu, m);
    if (threadIdx.x == 0) atomicMax(reinterpret_cast<unsigned int*>(amax), m);
  }
}

}  // namespace qmesh::detail::cuda
