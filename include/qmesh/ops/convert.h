// Conversions between fp32 and bf16 (the BF16 recipe's GEMM operands, bf16 activations).
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// out[i] = bf16(in[i]), round to nearest even (qmesh/float16.h's fp32_to_bf16 on the host,
// the same rounding on CUDA for finite values). in: fp32; out: bf16 with in's element count
// (any shape) on in's device. Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void convert_to_bf16(const TensorView& in, const TensorView& out, Stream stream = {});

// out[i] = fp32(in[i]) (exact). in: bf16; out: fp32 with in's element count on in's device.
// Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void convert_to_fp32(const TensorView& in, const TensorView& out, Stream stream = {});

}  // namespace qmesh
