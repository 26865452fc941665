// Block-scaled FP8 quantization (the Float8BlockScaling recipe; docs/design/block_scaling.md):
// every 1x128 block or 128x128 tile gets its own scale from its own amax, in one pass.
#pragma once

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/export.h"
#include "qmesh/scaling/recipe.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// x is read as its row-major [rows, cols] view (fp32, bf16 or fp16) and out holds a
// [rows, cols] block-scaled tensor of the same device (blocks per out.block). For every block
// of out.data (and, if out has a columnwise copy, every block of out.data_t, the transpose):
//   amax = max |x| over the block's elements (a NaN makes it NaN),
//   scale = current_scale(amax, out.dtype(), {power_2_scale, amax_epsilon} of `params`),
//   codes = sat_rne(x * scale), scale_inv[block] = 1 / scale.
// A partial last block (rows or cols not a multiple of 128) is scaled by the elements it
// has. Only the scales of blocks are written: the zero padding of the scale rows is kept.
// Host: blocking, multi-threaded. CUDA: asynchronous on `stream`; host and CUDA give the same
// bits.
QMESH_API void block_quantize(const TensorView& x, const BlockQuantizedTensorView& out,
                              const QParams& params, Stream stream = {});

// block_quantize of the output gradient g plus, in the same pass,
//   dbias[c] = sum over rows r of g[r, c]   (fp32 [cols], accumulated in fp32)
// summed in a fixed order (docs/design/block_scaling.md) that both backends follow, so host
// and CUDA give the same bits here too.
QMESH_API void block_dbias_quantize(const TensorView& g, const BlockQuantizedTensorView& out,
                                    const TensorView& dbias, const QParams& params,
                                    Stream stream = {});

// out[r, c] = decode(in.data[r, c]) * in.scale_inv[block of (r, c)], rounded to out's dtype
// (fp32, bf16 or fp16; out has rows * cols elements, read row-major). Reads the rowwise
// codes only. Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void block_dequantize(const BlockQuantizedTensorView& in, const TensorView& out,
                                Stream stream = {});

}  // namespace qmesh
