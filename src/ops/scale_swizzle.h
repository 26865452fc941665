// The scale swizzle of the native microscaled GEMMs: qmesh's row-major block scales
// rearranged into cuBLASLt's tiled layout (ops/scale_swizzle_layout.h).
#pragma once

#include "qmesh/export.h"
#include "qmesh/shape.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh::detail {

// [round_up(rows, 128), round_up(cols, 4)]: the swizzled form of a [rows, cols] scale matrix.
QMESH_API Shape swizzled_scale_shape(int64_t rows, int64_t cols);

// Writes the swizzled form of `scales` (2-D [rows, cols], row-major, a 1-byte scale dtype:
// fp8e8m0 for MXFP8, fp8e4m3 for NVFP4) into `out` (the same dtype and device, shape
// swizzled_scale_shape(rows, cols)), padding included (0). Host: computes it at once; CUDA:
// enqueues one kernel on `stream`. Error for other dtypes, shapes or devices.
QMESH_API void swizzle_block_scales(const TensorView& scales, const TensorView& out, Stream stream);

}  // namespace qmesh::detail
