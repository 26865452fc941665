// Bias ops of the dense layers: the bias gradient (column sums) and a row-wise bias add.
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// dbias[c] = sum over rows r of g[r, c], rows summed in order from 0 (fp32 accumulation).
// g: fp32 [rows, cols]; dbias: fp32 [cols] on g's device, overwritten. Host: blocking. CUDA:
// asynchronous on `stream` (partial sums over row blocks, then their sum).
QMESH_API void bias_grad(const TensorView& g, const TensorView& dbias, Stream stream = {});

// y[r, c] += bias[c] for every row, in place, in fp32. y: fp32 or bf16 (rounded to nearest even)
// [rows, cols]; bias: fp32 [cols] on y's device. Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void add_bias(const TensorView& y, const TensorView& bias, Stream stream = {});

}  // namespace qmesh
