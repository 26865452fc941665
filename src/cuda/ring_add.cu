// The fp32 sum of two partials for the reduce-scatter ring (overlap/ring_device.h).
#include <cuda_runtime_api.h>

#include <cstdint>

#include "overlap/ring_device.h"
#include "qmesh/cuda_check.h"

namespace qmesh::overlap_detail {

namespace {

constexpr int kThreads = 256;

// Grid-stride sums, one float per step; add_fp32x4_kernel takes four when the pointers
// allow 16-byte accesses. __fadd_rn keeps the sum exact-then-rounded (never fused).
__global__ void add_fp32_kernel(float* out, const float* a, const float* b, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    out[i] = __fadd_rn(a[i], b[i]);
}

__global__ void add_fp32x4_kernel(float4* out, const float4* a, const float4* b, int64_t n4) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n4; i += stride) {
    const float4 x = a[i], y = b[i];
    out[i] = make_float4(__fadd_rn(x.x, y.x), __fadd_rn(x.y, y.y), __fadd_rn(x.z, y.z),
                         __fadd_rn(x.w, y.w));
  }
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void add_fp32_async(float* out, const float* a, const float* b, int64_t n, Stream s) {
  if (n <= 0) return;
  auto* stream = static_cast<cudaStream_t>(s.handle);
  constexpr int64_t kMaxBlocks = 4096;
  const bool vector = n % 4 == 0 && aligned16(out) && aligned16(a) && aligned16(b);
  const int64_t items = vector ? n / 4 : n;
  const auto blocks =
      static_cast<unsigned>(items / kThreads + 1 < kMaxBlocks ? items / kThreads + 1 : kMaxBlocks);
  if (vector) {
    add_fp32x4_kernel<<<blocks, kThreads, 0, stream>>>(reinterpret_cast<float4*>(out),
                                                       reinterpret_cast<const float4*>(a),
                                                       reinterpret_cast<const float4*>(b), items);
  } else {
    add_fp32_kernel<<<blocks, kThreads, 0, stream>>>(out, a, b, n);
  }
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::overlap_detail
