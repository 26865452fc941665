// CUDA backend of the scale swizzle (ops/scale_swizzle.h); cpu/scale_swizzle.cpp is its host
// twin. One thread per output byte, padding included: the writes are coalesced, the reads
// gather (scale matrices are small: K/32 or K/16 bytes per row of an operand).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "cuda/scale_swizzle.h"
#include "ops/scale_swizzle_layout.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"

namespace qmesh::detail::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void swizzle_kernel(const uint8_t* in, int64_t rows, int64_t cols, int64_t bytes,
                               uint8_t* out) {
  const int64_t o = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (o >= bytes) return;
  const int64_t src = swizzled_scale_source(o, rows, cols);
  out[o] = src < 0 ? uint8_t{0} : in[src];
}

}  // namespace

void swizzle_block_scales(int device, const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out,
                          Stream stream) {
  const DeviceGuard guard(device);
  const int64_t bytes = swizzled_scale_bytes(rows, cols);
  const auto blocks = unsigned((bytes + kThreads - 1) / kThreads);
  swizzle_kernel<<<blocks, kThreads, 0, static_cast<cudaStream_t>(stream.handle)>>>(in, rows, cols,
                                                                                    bytes, out);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
