// LayerNorm over the last dimension of a [rows, cols] fp32 matrix:
//   y = (x - mean) / sqrt(var + eps) * gamma + beta,   var the biased variance of the row.
// Statistics are fp32 (two passes: the mean, then the squared deviations).
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// x, y: fp32 [rows, cols] (any shape, read as rows x last dimension); gamma, beta: fp32 [cols];
// mean, rstd: fp32 [rows] (written: the row's mean and 1 / sqrt(var + eps), kept for
// backward). eps > 0. All on one device. Host: blocking. CUDA: asynchronous on `stream`
// (norm_forward's kernel: x read once).
QMESH_API void layer_norm_forward(const TensorView& x, const TensorView& gamma,
                                  const TensorView& beta, float eps, const TensorView& y,
                                  const TensorView& mean, const TensorView& rstd,
                                  Stream stream = {});

// Backward of layer_norm_forward from forward's x, gamma, mean and rstd and the output
// gradient dy (shaped like x):
//   dx = rstd * (dy*gamma - mean_c(dy*gamma) - xhat * mean_c(dy*gamma*xhat)),
//   dgamma = sum_r dy * xhat,  dbeta = sum_r dy   (overwritten, not accumulated).
// dx shaped like x (may not alias dy); dgamma, dbeta fp32 [cols]. With `residual` (fp32,
// shaped like x, not aliasing dx or dy): dx = residual + the dx above, in the same pass (the
// gradient of a residual block y = x + f(LayerNorm(x)); the same bits as add(residual, dx,
// dx) after it). All on one device. Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void layer_norm_backward(const TensorView& dy, const TensorView& x,
                                   const TensorView& gamma, const TensorView& mean,
                                   const TensorView& rstd, const TensorView& dx,
                                   const TensorView& dgamma, const TensorView& dbeta,
                                   Stream stream = {}, const TensorView& residual = {});

}  // namespace qmesh
