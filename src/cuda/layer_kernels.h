// Launchers of the CUDA kernels behind the layer ops (ops/layer_norm.h, ops/bias.h,
// ops/gelu.h, ops/add.h, ops/convert.h) and the optimizers. Arguments are checked by the
// callers; every launcher makes `device` current, enqueues on `stream` and returns at once.
#pragma once

#include <cstdint>

#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

// residual: null, or added to dx (ops/layer_norm.h).
void layer_norm_backward(int device, const float* dy, const float* x, const float* gamma,
                         const float* mean, const float* rstd, const float* residual, float* dx,
                         float* dgamma, float* dbeta, int64_t rows, int64_t cols, Stream stream);
// out[c] = sum_r g[r, c].
void column_sums(int device, const float* g, float* out, int64_t rows, int64_t cols, Stream stream);
// Activations (y, x, dy, pre) are fp32, or bf16 where their flag says so.
void add_bias(int device, void* y, bool y_bf16, const float* bias, int64_t rows, int64_t cols,
              Stream stream);
void gelu(int device, const void* x, bool x_bf16, void* y, bool y_bf16, int64_t n, Stream stream);
void dgelu(int device, const void* dy, const void* pre, bool in_bf16, float* dx, int64_t n,
           Stream stream);
void add(int device, const float* a, const float* b, float* out, int64_t n, Stream stream);
void convert_to_bf16(int device, const float* in, uint16_t* out, int64_t n, Stream stream);
void convert_to_fp32(int device, const uint16_t* in, float* out, int64_t n, Stream stream);
// out [cols, rows] = in [rows, cols]^T, elements of `bytes` (1, 2, 4 or 8) bytes.
void transpose(int device, const void* in, void* out, int64_t rows, int64_t cols, int bytes,
               Stream stream);

// The optimizer updates of src/train/optimizer.cpp, element by element with the same float
// operations. m is null for SGD without momentum.
void sgd_update(int device, float* w, const float* g, float* m, int64_t n, float lr, float momentum,
                float weight_decay, Stream stream);
void adamw_update(int device, float* w, const float* g, float* m, float* v, int64_t n, float lr,
                  float beta1, float beta2, float eps, float weight_decay, float bias1, float bias2,
                  Stream stream);

}  // namespace qmesh::detail::cuda
