// The internal description of one block-scaled cast (ops/block_quantize.h) that both backends
// execute, and the scale-layout and summation-order rules they share.
#pragma once

#include <cstdint>

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/dtype.h"
#include "qmesh/scaling/recipe.h"

namespace qmesh::detail {

// The CUDA kernel's thread geometry, which fixes the order of the dbias sums (host twin
// alike): a 128 x 128 tile is read by kBlockRowGroups groups of threads; group g holds tile
// rows g, g + kBlockRowGroups, ... (kBlockRowGroups apart). Column c of a tile sums, in fp32,
//   s[g]  = ((0 + x[g]) + x[g + 16]) + ... + x[g + 112]            for each group g,
//   w[k]  = s[2k] + s[2k + 1]                                      k = 0..7,
//   tile  = ((0 + w[0]) + w[1]) + ... + w[7],
//   dbias = ((0 + tile[row block 0]) + tile[row block 1]) + ...
// where rows past the tensor's end read as 0.
inline constexpr int kBlockRowGroups = 16;
inline constexpr int kBlockGroupPairs = kBlockRowGroups / 2;

// rows x cols elements of `in` (row-major), cast into a block-scaled tensor.
struct BlockCastJob {
  DType in_dtype = DType::kFloat32;  // fp32, bf16 or fp16
  DType fp8 = DType::kFloat8E4M3;
  BlockShape block = BlockShape::k1x128;
  Float8CurrentScaling scaling;  // power_of_two_scales and amax_epsilon of the block scales
  const void* in = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  uint8_t* out = nullptr;        // rowwise codes [rows, cols]
  float* scale_inv = nullptr;    // block_scale_shape(rows, cols, block)
  int64_t scale_ld = 0;          // its row stride (floats)
  uint8_t* out_t = nullptr;      // columnwise codes [cols, rows]; null: none
  float* scale_inv_t = nullptr;  // block_scale_shape(cols, rows, block)
  int64_t scale_t_ld = 0;
  float* dbias = nullptr;  // fp32 [cols]; null: none
};

}  // namespace qmesh::detail
