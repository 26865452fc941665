// CUDA kernels of the layer ops and the optimizers: fp32 math (bias add, GELU and its backward
// also read or write bf16 activations), one launch per call,
// asynchronous on the caller's stream.
//
// LayerNorm backward: one block per row; the row's sums are block reductions (warp shuffles,
// then shared memory across warps); the forward is cuda/norm.cu. The column sums (bias and
// LayerNorm parameter gradients) run in two passes: blocks of kSumRows rows write partial sums,
// then one thread per column adds them up.
#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "cpu/gelu.h"
#include "cuda/block_sum.h"
#include "cuda/layer_kernels.h"
#include "cuda/stream_scratch.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"

namespace qmesh::detail::cuda {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kSumRows = 256;             // rows per partial sum in the column-sum kernels
constexpr int64_t kMaxGridY = 65535;      // CUDA's limit on gridDim.y
constexpr int kTile = 32, kTileRows = 8;  // transpose: 32 x 32 tiles, 8 rows of threads

// One 32 x 32 tile per block through shared memory (padded against bank conflicts): reads and
// writes are both coalesced along rows.
template <class T>
__global__ void transpose_kernel(const T* in, T* out, int64_t rows, int64_t cols) {
  __shared__ T tile[kTile][kTile + 1];
  const int64_t c0 = int64_t(blockIdx.x) * kTile, r0 = int64_t(blockIdx.y) * kTile;
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t r = r0 + i, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[i][threadIdx.x] = in[r * cols + c];
  }
  __syncthreads();
  for (int i = threadIdx.y; i < kTile; i += kTileRows) {
    const int64_t c = c0 + i, r = r0 + threadIdx.x;  // out row c, column r
    if (c < cols && r < rows) out[c * rows + r] = tile[threadIdx.x][i];
  }
}

cudaStream_t native(Stream stream) { return static_cast<cudaStream_t>(stream.handle); }

// Blocks of kThreads covering n elements; n must be > 0 (a grid of size 0 is an error):
// every entry point returns early for empty tensors.
unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

__global__ void __launch_bounds__(kThreads)
    layer_norm_dx_kernel(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, const float* residual, float* dx, int64_t cols) {
  __shared__ float scratch[kWarps];
  const int64_t row = blockIdx.x;
  const float* xr = x + row * cols;
  const float* dyr = dy + row * cols;
  const float m = mean[row], r = rstd[row];
  float s1 = 0.0f, s2 = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const float dxhat = dyr[c] * gamma[c];
    s1 += dxhat;
    s2 += dxhat * ((xr[c] - m) * r);
  }
  const float inv_n = 1.0f / float(cols);
  const float sum_dxhat = block_sum<kThreads>(s1, scratch);
  const float sum_dxhat_xhat = block_sum<kThreads>(s2, scratch);
  float* dxr = dx + row * cols;
  for (int64_t c = threadIdx.x; c < cols; c += kThreads) {
    const float xhat = (xr[c] - m) * r;
    const float d = r * (dyr[c] * gamma[c] - inv_n * sum_dxhat - xhat * inv_n * sum_dxhat_xhat);
    // The residual add rounded on its own (no FMA with the product): the host's bits.
    dxr[c] = residual != nullptr ? __fadd_rn(residual[row * cols + c], d) : d;
  }
}

// Pass 1 of the column sums: partial[p, c] = sum of rows [p * kSumRows, ...) of column c, of g
// (and, with x/mean/rstd, of g * xhat into partial_xhat), for every row block p < parts. The
// grid's y blocks take row blocks p = blockIdx.y, + gridDim.y, ... (gridDim.y <= 65535).
__global__ void __launch_bounds__(kThreads)
    partial_column_sums_kernel(const float* g, const float* x, const float* mean, const float* rstd,
                               float* partial, float* partial_xhat, int64_t rows, int64_t cols,
                               int64_t parts) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  for (int64_t p = blockIdx.y; p < parts; p += gridDim.y) {
    const int64_t r0 = p * kSumRows;
    const int64_t r1 = r0 + kSumRows < rows ? r0 + kSumRows : rows;
    float s = 0.0f, sx = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      const float v = g[r * cols + c];
      s += v;
      if (x != nullptr) sx += v * ((x[r * cols + c] - mean[r]) * rstd[r]);
    }
    partial[p * cols + c] = s;
    if (x != nullptr) partial_xhat[p * cols + c] = sx;
  }
}

// Pass 2: out[c] = sum over the `parts` rows of partial.
__global__ void __launch_bounds__(kThreads)
    sum_partials_kernel(const float* partial, float* out, int64_t parts, int64_t cols) {
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (c >= cols) return;
  float s = 0.0f;
  for (int64_t p = 0; p < parts; ++p) s += partial[p * cols + c];
  out[c] = s;
}

// out[c] = sum_r g[r, c] (and out_xhat[c] = sum_r g[r, c] * xhat[r, c] when x is given), with
// a stream-ordered workspace for the partial sums.
void column_sums_impl(const float* g, const float* x, const float* mean, const float* rstd,
                      float* out, float* out_xhat, int64_t rows, int64_t cols, Stream stream) {
  const cudaStream_t s = native(stream);
  if (cols == 0) return;
  if (rows == 0) {  // empty sums: zeros, no launch
    QMESH_CHECK_CUDA(cudaMemsetAsync(out, 0, size_t(cols) * sizeof(float), s));
    if (out_xhat) QMESH_CHECK_CUDA(cudaMemsetAsync(out_xhat, 0, size_t(cols) * sizeof(float), s));
    return;
  }
  const int64_t parts = (rows + kSumRows - 1) / kSumRows;
  const int64_t slices = x != nullptr ? 2 : 1;
  const StreamScratch<float> scratch(size_t(slices * parts * cols), s);
  float* partial = scratch.get();
  float* partial_xhat = x != nullptr ? partial + parts * cols : nullptr;
  const auto grid_y = static_cast<unsigned>(parts < kMaxGridY ? parts : kMaxGridY);
  partial_column_sums_kernel<<<dim3(blocks_for(cols), grid_y), kThreads, 0, s>>>(
      g, x, mean, rstd, partial, partial_xhat, rows, cols, parts);
  QMESH_CHECK_CUDA(cudaGetLastError());
  sum_partials_kernel<<<blocks_for(cols), kThreads, 0, s>>>(partial, out, parts, cols);
  QMESH_CHECK_CUDA(cudaGetLastError());
  if (x != nullptr) {
    sum_partials_kernel<<<blocks_for(cols), kThreads, 0, s>>>(partial_xhat, out_xhat, parts, cols);
    QMESH_CHECK_CUDA(cudaGetLastError());
  }
}

// Activations are fp32 or bf16 (converted to nearest even on store); the math is fp32.
__device__ float load(const float* p, int64_t i) { return p[i]; }
__device__ float load(const __nv_bfloat16* p, int64_t i) { return __bfloat162float(p[i]); }
__device__ void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

template <class Y>
__global__ void add_bias_kernel(Y* y, const float* bias, int64_t n, int64_t cols) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) store(y, i, load(y, i) + bias[i % cols]);
}

// GELU and its backward as the host computes them (cpu/gelu.h): the same bits.
template <class X, class Y>
__global__ void gelu_kernel(const X* x, Y* y, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) store(y, i, ::qmesh::gelu(load(x, i)));
}

template <class X>
__global__ void dgelu_kernel(const X* dy, const X* pre, float* dx, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) dx[i] = __fmul_rn(load(dy, i), ::qmesh::dgelu(load(pre, i)));
}

__global__ void widen_bf16_kernel(const __nv_bfloat16* in, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = __bfloat162float(in[i]);
}

// Calls f with a null pointer of the activation type (bf16 or fp32).
template <class F>
void with_activation_type(bool bf16, F&& f) {
  if (bf16)
    f(static_cast<__nv_bfloat16*>(nullptr));
  else
    f(static_cast<float*>(nullptr));
}

__global__ void add_kernel(const float* a, const float* b, float* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

__global__ void bf16_kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i < n) out[i] = __float2bfloat16_rn(in[i]);
}

__global__ void sgd_kernel(float* w, const float* g, float* m, int64_t n, float lr, float momentum,
                           float weight_decay) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  float d = g[i];
  if (m != nullptr) {
    m[i] = momentum * m[i] + d;
    d = m[i];
  }
  w[i] -= lr * (d + weight_decay * w[i]);
}

__global__ void adamw_kernel(float* w, const float* g, float* m, float* v, int64_t n, float lr,
                             float beta1, float beta2, float eps, float weight_decay, float bias1,
                             float bias2) {
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x;
  if (i >= n) return;
  m[i] = beta1 * m[i] + (1.0f - beta1) * g[i];
  v[i] = beta2 * v[i] + (1.0f - beta2) * g[i] * g[i];
  const float m_hat = m[i] / bias1, v_hat = v[i] / bias2;
  w[i] -= lr * (m_hat / (sqrtf(v_hat) + eps) + weight_decay * w[i]);
}

}  // namespace

void layer_norm_backward(int device, const float* dy, const float* x, const float* gamma,
                         const float* mean, const float* rstd, const float* residual, float* dx,
                         float* dgamma, float* dbeta, int64_t rows, int64_t cols, Stream stream) {
  const DeviceGuard guard(device);
  if (rows > 0) {
    layer_norm_dx_kernel<<<static_cast<unsigned>(rows), kThreads, 0, native(stream)>>>(
        dy, x, gamma, mean, rstd, residual, dx, cols);
    QMESH_CHECK_CUDA(cudaGetLastError());
  }
  column_sums_impl(dy, x, mean, rstd, dbeta, dgamma, rows, cols, stream);
}

void column_sums(int device, const float* g, float* out, int64_t rows, int64_t cols,
                 Stream stream) {
  const DeviceGuard guard(device);
  column_sums_impl(g, nullptr, nullptr, nullptr, out, nullptr, rows, cols, stream);
}

void add_bias(int device, void* y, bool y_bf16, const float* bias, int64_t rows, int64_t cols,
              Stream stream) {
  const DeviceGuard guard(device);
  if (rows * cols == 0) return;
  with_activation_type(y_bf16, [&](auto* tag) {
    using Y = std::remove_pointer_t<decltype(tag)>;
    add_bias_kernel<<<blocks_for(rows * cols), kThreads, 0, native(stream)>>>(
        static_cast<Y*>(y), bias, rows * cols, cols);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void gelu(int device, const void* x, bool x_bf16, void* y, bool y_bf16, int64_t n, Stream stream) {
  const DeviceGuard guard(device);
  if (n == 0) return;
  with_activation_type(x_bf16, [&](auto* x_tag) {
    with_activation_type(y_bf16, [&](auto* y_tag) {
      using X = std::remove_pointer_t<decltype(x_tag)>;
      using Y = std::remove_pointer_t<decltype(y_tag)>;
      gelu_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(static_cast<const X*>(x),
                                                                  static_cast<Y*>(y), n);
    });
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void dgelu(int device, const void* dy, const void* pre, bool in_bf16, float* dx, int64_t n,
           Stream stream) {
  const DeviceGuard guard(device);
  if (n == 0) return;
  with_activation_type(in_bf16, [&](auto* tag) {
    using X = std::remove_pointer_t<decltype(tag)>;
    dgelu_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(static_cast<const X*>(dy),
                                                                 static_cast<const X*>(pre), dx, n);
  });
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void add(int device, const float* a, const float* b, float* out, int64_t n, Stream stream) {
  const DeviceGuard guard(device);
  if (n == 0) return;
  add_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(a, b, out, n);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void transpose(int device, const void* in, void* out, int64_t rows, int64_t cols, int bytes,
               Stream stream) {
  const DeviceGuard guard(device);
  if (rows == 0 || cols == 0) return;
  const dim3 block(kTile, kTileRows);
  const int64_t tiles_x = (cols + kTile - 1) / kTile, tiles_y = (rows + kTile - 1) / kTile;
  QMESH_CHECK(tiles_y < 65536, "CUDA transpose: ", rows, " rows are too many (at most ",
              65535 * kTile, ")");
  const dim3 grid(static_cast<unsigned>(tiles_x), static_cast<unsigned>(tiles_y));
  const cudaStream_t s = native(stream);
  auto launch = [&](auto word) {  // elements moved as unsigned words of their size
    using T = decltype(word);
    transpose_kernel<T>
        <<<grid, block, 0, s>>>(static_cast<const T*>(in), static_cast<T*>(out), rows, cols);
  };
  switch (bytes) {
    case 1:
      launch(uint8_t{});
      break;
    case 2:
      launch(uint16_t{});
      break;
    case 4:
      launch(uint32_t{});
      break;
    case 8:
      launch(uint64_t{});
      break;
    default:
      QMESH_THROW_KIND(ErrorKind::kUnsupported, "CUDA transpose: elements of ", bytes,
                       " bytes are not supported");
  }
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void convert_to_bf16(int device, const float* in, uint16_t* out, int64_t n, Stream stream) {
  const DeviceGuard guard(device);
  if (n == 0) return;
  bf16_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(
      in, reinterpret_cast<__nv_bfloat16*>(out), n);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void convert_to_fp32(int device, const uint16_t* in, float* out, int64_t n, Stream stream) {
  const DeviceGuard guard(device);
  if (n == 0) return;
  widen_bf16_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(
      reinterpret_cast<const __nv_bfloat16*>(in), out, n);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void sgd_update(int device, float* w, const float* g, float* m, int64_t n, float lr, float momentum,
                float weight_decay, Stream stream) {
  const DeviceGuard guard(device);
  if (n == 0) return;
  sgd_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(w, g, m, n, lr, momentum,
                                                             weight_decay);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

void adamw_update(int device, float* w, const float* g, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float bias1, float bias2,
                  Stream stream) {
  const DeviceGuard guard(device);
  if (n == 0) return;
  adamw_kernel<<<blocks_for(n), kThreads, 0, native(stream)>>>(w, g, m, v, n, lr, beta1, beta2, eps,
                                                               weight_decay, bias1, bias2);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
