// grouped_quantize: several tensors packed one after another in one buffer (e.g. one per
// expert), each quantized with its own scale and amax, in one launch; grouped_block_quantize,
// grouped_mxfp8_quantize and grouped_nvfp4_quantize: the same with block scaling, MXFP8 and
// NVFP4, each group exactly as the non-grouped op on its rows.
#pragma once

#include <cstdint>
#include <span>

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/export.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/ops/nvfp4_quantize.h"
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

// x (fp32, bf16 or fp16) holds the groups back to back as above: group g is the next
// [rows_g, cols] of x (outs[g].data's shape), MXFP8-quantized exactly as
// mxfp8_quantize(x_g, outs[g], margin) (its columnwise copy if outs[g] has one). rows_g must be
// a multiple of 32 (the 32x1 blocks of the copy start at each group's first row): Error
// otherwise, before anything runs. A group with no rows has empty views and is skipped. Host:
// blocking. CUDA: asynchronous on `stream`, one launch per group.
QMESH_API void grouped_mxfp8_quantize(const TensorView& x, std::span<const MxFp8TensorView> outs,
                                      float margin = 0.0f, Stream stream = {});

// The stochastic rounding seed of group g of a grouped NVFP4 quantize with seed `seed`:
// seed + g * 0x9E3779B97F4A7C15 (mod 2^64, the splitmix64 increment), so group 0 rounds as the
// non-grouped quantize with `seed` and no two groups share their rounding bits.
QMESH_API uint64_t nvfp4_group_seed(uint64_t seed, int64_t group);

// x (fp32, bf16 or fp16) holds the groups back to back: group g is the next [rows_g, cols] of
// x (outs[g].rows(), outs[g].cols()), NVFP4-quantized exactly as nvfp4_quantize(x_g, outs[g],
// options_g), where options_g is `options` with seed nvfp4_group_seed(options.seed, g): its
// own per-tensor scales from its own amax (outs[g].scale_inv, scale_inv_t), the same RHT
// signs for every group. rows_g must be a multiple of 16 (Error otherwise, before anything
// runs); a group with no rows has empty views and is skipped. options.seed_key is refused (the
// per-group seeds are derived on the host: pass options.seed), and so are the options of a
// shard (amax, columnwise_amax, origin). Host: blocking. CUDA:
// asynchronous on `stream`, one launch per group.
QMESH_API void grouped_nvfp4_quantize(const TensorView& x, std::span<const NvFp4TensorView> outs,
                                      const NvFp4Options& options, Stream stream = {});

}  // namespace qmesh
