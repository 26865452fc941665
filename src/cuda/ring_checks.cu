// Device-side combination and checks of the all-gather GEMM (overlap/ring_device.h): the max
// of the chunks' amaxes and the scale agreement check, both stream-ordered so that the host
// never waits for the device.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "overlap/ring_device.h"
#include "qmesh/cuda_check.h"

namespace qmesh::overlap_detail {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

__global__ void max_fp32_kernel(float* out, const float* in, int n, int stride) {
  float m = in[0];
  for (int i = 1; i < n; ++i) {
    const float v = in[i * stride];
    m = (v > m || v != v) ? v : m;
  }
  *out = m;
}

// Every thread reads the n scales (n is the group size: a handful of floats).
__device__ bool same_scales(const float* scales, int n, int rank) {
  const float mine = scales[rank];
  for (int p = 0; p < n; ++p)
    if (!(scales[p] == mine)) return false;
  return true;
}

template <class T>
__global__ void poison_kernel(const float* scales, int n, int rank, T* d, int64_t elems, T nan_bits,
                              float* amax) {
  if (same_scales(scales, n, rank)) return;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t i = first; i < elems; i += stride) d[i] = nan_bits;
  if (first == 0 && amax) *amax = __int_as_float(0x7FC00000);
}

template <class T>
void launch_poison(const float* scales, int n, int rank, void* d, int64_t elems, uint32_t nan_bits,
                   float* amax, cudaStream_t stream) {
  const int64_t wanted = (elems + kThreads - 1) / kThreads;
  // At least one block, so that the amax is poisoned even for an empty D.
  const auto blocks = static_cast<unsigned>(wanted < 1            ? 1
                                            : wanted > kMaxBlocks ? kMaxBlocks
                                                                  : wanted);
  poison_kernel<T><<<blocks, kThreads, 0, stream>>>(scales, n, rank, static_cast<T*>(d), elems,
                                                    static_cast<T>(nan_bits), amax);
}

}  // namespace

void max_fp32_async(float* out, const float* in, int n, int stride, Stream s) {
  max_fp32_kernel<<<1, 1, 0, static_cast<cudaStream_t>(s.handle)>>>(out, in, n, stride);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void poison_unless_same_async(const float* scales, int n, int rank, void* d, int64_t elems,
                              int elem_bytes, uint32_t nan_bits, float* amax, Stream s) {
  auto* stream = static_cast<cudaStream_t>(s.handle);
  switch (elem_bytes) {
    case 4:
      launch_poison<uint32_t>(scales, n, rank, d, elems, nan_bits, amax, stream);
      break;
    case 2:
      launch_poison<uint16_t>(scales, n, rank, d, elems, nan_bits, amax, stream);
      break;
    default:
      launch_poison<uint8_t>(scales, n, rank, d, elems, nan_bits, amax, stream);
  }
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::overlap_detail
