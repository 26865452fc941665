// grouped_quantize: several tensors packed one after another in one buffer (e.g. one per
// expert), each quantized with its own scale and amax, in one launch; grouped_block_quantize:
// the same with block scaling.
#pragma once

#include <span>

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/export.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// x (fp32, bf16 or fp16) holds the groups back to back: group g is the next
// outs[g].data.numel() elements of x, read as a matrix of outs[g].data's shape. The element
// counts must add up to x.numel(). Each group is quantized as quantize(x_g, outs[g]) does,
// or as cast_transpose when outs[g] has a columnwise copy (its own scale, scale_inv, amax).
// All outs live on x's device. Host: blocking. CUDA: asynchronous on `stream`; rowwise-only
// groups take one kernel launch per 64 groups, groups with a columnwise copy one each.
QMESH_API void grouped_quantize(const TensorView& x, std::span<const QuantizedTensorView> outs,
                                Stream stream = {});

// x (fp32, bf16 or fp16) holds the groups back to back as above: group g is the next
// outs[g].data.numel() elements of x, read as a matrix of outs[g].data's shape, and is
// block-quantized exactly as block_quantize(x_g, outs[g], params) (its own blocks, starting at
// its first row; its columnwise copy if outs[g] has one). A group with no rows has empty
// views (outs[g].data.empty()) and is skipped. The element counts must add up to x.numel(). All
// outs live on x's device. Host: blocking. CUDA: asynchronous on `stream`, one launch per group.
QMESH_API void grouped_block_quantize(const TensorView& x,
                                      std::span<const BlockQuantizedTensorView> outs,
                                      const QParams& params, Stream stream = {});

}  // namespace qmesh
