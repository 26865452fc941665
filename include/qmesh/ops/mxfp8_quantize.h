// MXFP8 quantization (OCP Microscaling; the MXFP8BlockScaling recipe, docs/design/mxfp8.md):
// one E8M0 scale per 32 consecutive elements, rowwise and columnwise in one pass.
#pragma once

#include "qmesh/export.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// x is read as its row-major [rows, cols] view (fp32, bf16 or fp16; rows and cols multiples of
// 32) and out is a [rows, cols] MXFP8 tensor on x's device. For every 1x32 block of out.data
// (and, if out has a columnwise copy, every 1x32 block of out.data_t, i.e. every 32x1 block
// of x):
//   amax  = max |x| over the block (NaN if it holds a NaN),
//   byte  = e8m0_scale_for_amax(amax, fp8_max(out.dtype()) * 2^-margin)   (rounds up),
//   codes = sat_rne(x * 2^(127 - byte))   (x * 1 for byte 0xFF),   scale[block] = byte.
// margin: finite, >= 0. Host: blocking, multi-threaded. CUDA: asynchronous on `stream`; host
// and CUDA give the same bits.
QMESH_API void mxfp8_quantize(const TensorView& x, const MxFp8TensorView& out, float margin = 0.0f,
                              Stream stream = {});

// mxfp8_quantize of the output gradient g plus, in the same pass,
//   dbias[c] = sum over rows r of g[r, c]   (fp32 [cols])
// in a fixed order that both backends follow (same bits): per strip of 32 rows
// s = ((0 + g[r0, c]) + g[r0 + 1, c]) + ... + g[r0 + 31, c], then
// dbias[c] = ((0 + s[strip 0]) + s[strip 1]) + ...
QMESH_API void mxfp8_dbias_quantize(const TensorView& g, const MxFp8TensorView& out,
                                    const TensorView& dbias, float margin = 0.0f,
                                    Stream stream = {});

// out[r, c] = decode(in.data[r, c]) * 2^(in.scale[r, c / 32] - 127) (NaN where the scale is
// 0xFF), rounded to out's dtype (fp32, bf16 or fp16; rows * cols elements, row-major). Reads
// the rowwise codes only (view the columnwise copy as rowwise data to decode it). Host:
// blocking. CUDA: asynchronous on `stream`.
QMESH_API void mxfp8_dequantize(const MxFp8TensorView& in, const TensorView& out,
                                Stream stream = {});

}  // namespace qmesh
