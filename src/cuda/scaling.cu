// CUDA kernels of the scaling recipes: the fused multi-tensor delayed-scaling update and the
// on-device current-scaling scale.
#include "cuda/scaling.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "scaling/scale_rules.h"

namespace qmesh::detail::cuda {

namespace {

// A block updates kCols operands; its kRows x kCols threads walk their history columns
// kRows rows at a time. With the [len, n] layout, the kCols = 8 neighbouring operands of a
// history row are 32 contiguous bytes: every warp access uses whole 32-byte sectors.
constexpr int kCols = 8;
constexpr int kRows = 128;

__global__ void __launch_bounds__(kCols* kRows)
    update_kernel(float* history, float* scale, int64_t scale_stride, const float* fp8_max, int n,
                  int len, bool most_recent, float margin_scale) {
  __shared__ float partial[kRows][kCols];
  const int tx = threadIdx.x % kCols, ty = threadIdx.x / kCols;
  const int i = blockIdx.x * kCols + tx;
  const float current = i < n ? history[i] : 0.0f;
  // An operand whose amax is 0 after the reduction did not run: no roll, no new scale.
  const bool active = current != 0.0f;
  // The window's max skips NaN (docs/numerics.md): start from 0, as an all-NaN or all-zero
  // window keeps the scale.
  float m = 0.0f;
  __syncthreads();  // row 0 is read everywhere before any thread overwrites it
  // Roll by -1 in place: row j takes row j + 1, the last row takes the old row 0, and row 0
  // (which took row 1) is zeroed. Reads of a round precede its writes (barrier), and a round
  // writes only rows that the previous rounds have already read.
  for (int j0 = 0; j0 < len; j0 += kRows) {
    const int j = j0 + ty;
    float v = 0.0f;
    if (active && j < len) {
      v = j + 1 < len ? history[int64_t(j + 1) * n + i] : current;
      m = skip_nan_max(m, v);
    }
    __syncthreads();
    if (active && j < len) history[int64_t(j) * n + i] = j == 0 ? 0.0f : v;
  }
  partial[ty][tx] = m;
  __syncthreads();
  for (int s = kRows / 2; s > 0; s /= 2) {
    if (ty < s) partial[ty][tx] = skip_nan_max(partial[ty][tx], partial[ty + s][tx]);
    __syncthreads();
  }
  if (ty == 0 && active) {
    const float amax = most_recent ? current : partial[0][tx];
    float& s = scale[i * scale_stride];
    s = delayed_scale(amax, s, delayed_scaled_max(fp8_max[i], margin_scale));
  }
}

__global__ void current_scale_kernel(const float* amax, float* scale, float fp8_max,
                                     bool power_of_two, float epsilon) {
  *scale = current_scale_rule(*amax, fp8_max, power_of_two, epsilon);
}

}  // namespace

void update_scales(int device, float* history, float* scale, int64_t scale_stride,
                   const float* fp8_max, int n, int len, bool most_recent, float margin_scale,
                   Stream stream) {
  if (n == 0) return;  // a grid of size 0 is an error
  const DeviceGuard guard(device);
  const unsigned blocks = static_cast<unsigned>((n + kCols - 1) / kCols);
  update_kernel<<<blocks, kCols * kRows, 0, static_cast<cudaStream_t>(stream.handle)>>>(
      history, scale, scale_stride, fp8_max, n, len, most_recent, margin_scale);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void set_current_scale(int device, const float* amax, float* scale, float fp8_max,
                       bool power_of_two, float epsilon, Stream stream) {
  const DeviceGuard guard(device);
  current_scale_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream.handle)>>>(
      amax, scale, fp8_max, power_of_two, epsilon);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
