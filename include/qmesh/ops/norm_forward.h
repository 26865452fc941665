// LayerNorm or RMSNorm forward over the last dimension, fused with the FP8 cast of its output:
// the normalised rows are quantized (and their amax taken) in the pass that computes them, so
// a norm in front of an FP8 GEMM never writes its output in a wide type unless asked to.
//
//   LayerNorm: y = (x - mean) * rstd * gamma + beta,  rstd = 1 / sqrt(mean((x - mean)^2) + eps)
//   RMSNorm:   y = x * rstd * gamma,                 rstd = 1 / sqrt(mean(x^2) + eps)
//   (gamma + 1 instead of gamma with zero_centered_gamma.)
//
// One sequence of fp32 operations on the host and on CUDA, so that both backends give the same
// y, mean, rstd, codes and amax bit for bit (docs/numerics.md, "Norms"): each row's sums are
// taken over 256 lanes (lane t adds columns t, t + 256, ... in order), the lanes of each group
// of 32 combined as a pairwise tree, the 8 group sums added in order; no fused multiply-adds.
// y is rounded to `y_dtype` (fp32 or bf16) before it is written, cast and measured, so the
// codes equal those of quantizing the written y: the fused op and "norm, then quantize" are
// the same bits. A NaN result counts as the canonical NaN 0x7FFFFFFF (as ops/cast_activation.h).
//
// Current scaling (the scale depends on max|y|) takes two calls: the first with `amax` only
// (the statistics and max|y|, nothing else written), then the recipe's scale from that amax,
// then the second with `codes`: x is read twice and y never stored, which moves fewer bytes
// than writing y and quantizing it (docs/benchmarks/fp8-layer-predictions.md).
#pragma once

#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

enum class NormType { kLayerNorm, kRmsNorm };

struct NormSpec {
  NormType type = NormType::kLayerNorm;
  float eps = 1e-5f;                 // > 0
  bool zero_centered_gamma = false;  // gamma holds the scale minus 1
};

// What one call writes; every member may be left empty (not written), at least one of y,
// codes and amax must be set. [rows, cols] is x's view (rows x last dimension).
struct NormOutputs {
  DType y_dtype = DType::kFloat32;  // fp32 or bf16: y's precision (y.dtype when y is set)
  TensorView y;                     // y_dtype [rows, cols]
  // FP8 codes of y with *codes.scale: data [rows, cols], data_t [cols, rows] when present,
  // *scale_inv = 1 / scale, *amax = max(*amax, max|y|) (running, as ops/quantize.h).
  QuantizedTensorView codes;
  TensorView amax;  // fp32 [1]: max|y| (replaced); only without codes (current scaling's pass 1)
  TensorView mean;  // fp32 [rows]; LayerNorm only (must be empty for RMSNorm)
  TensorView rstd;  // fp32 [rows]
};

// x: fp32 or bf16, not empty; gamma: fp32 [cols]; beta: fp32 [cols] for LayerNorm, empty for
// RMSNorm. Everything on x's device. Host: blocking. CUDA: asynchronous on `stream` (one block
// per row).
QMESH_API void norm_forward(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                            const NormSpec& spec, const NormOutputs& out, Stream stream = {});

}  // namespace qmesh
