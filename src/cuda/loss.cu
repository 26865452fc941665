// Mean-squared-error loss on CUDA: one grid-stride pass writes dy and one float64 partial
// sum per block; one block then adds the partials. The grid size is fixed, so every element
// lands in the same partial in the same order on every call: the sum is deterministic.
#include <cuda_runtime.h>

#include "cuda/block_sum.h"
#include "cuda/loss_kernel.h"
#include "cuda/stream_scratch.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"

namespace qmesh::detail::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kBlocks = 1024;  // partial sums; enough blocks to fill an H100/H200

__global__ void __launch_bounds__(kThreads)
    mse_partial_kernel(const float* y, const float* target, double global_count, float* dy,
                       double* partial, int64_t n) {
  double sum = 0;
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const double d = double(y[i]) - double(target[i]);
    sum += d * d;
    dy[i] = float(2.0 * d / global_count);
  }
  __shared__ double scratch[kThreads / 32];
  sum = block_sum<kThreads>(sum, scratch);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const double* partial, double* out, int count) {
  double sum = 0;
  for (int i = threadIdx.x; i < count; i += kThreads) sum += partial[i];
  __shared__ double scratch[kThreads / 32];
  sum = block_sum<kThreads>(sum, scratch);
  if (threadIdx.x == 0) *out = sum;
}

}  // namespace

void mse_loss(int device, const float* y, const float* target, double global_count, float* dy,
              double* sum_sq, int64_t n, Stream stream) {
  const DeviceGuard guard(device);
  const cudaStream_t s = static_cast<cudaStream_t>(stream.handle);
  const StreamScratch<double> partial(kBlocks, s);
  mse_partial_kernel<<<kBlocks, kThreads, 0, s>>>(y, target, global_count, dy, partial.get(), n);
  QMESH_CHECK_CUDA(cudaGetLastError());
  sum_partials_kernel<<<1, kThreads, 0, s>>>(partial.get(), sum_sq, kBlocks);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
