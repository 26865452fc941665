// A block-scaled FP8 tensor (the Float8BlockScaling recipe; docs/design/block_scaling.md):
// every 1x128 slice of a row (activations, gradients) or every 128x128 tile (weights) has its
// own fp32 scale. The codes are row-major like every qmesh tensor; the scales are stored the
// way cuBLASLt's VEC128_32F / BLK128x128_32F scale modes read them:
//
//   data [R, C] with 1x128 blocks:   scale_inv [ceil(C/128), round_up(R, 4)]
//       scale_inv[kb][r] = scale_inv of data[r, 128*kb : 128*kb + 128]
//   data [R, C] with 128x128 blocks: scale_inv [ceil(R/128), round_up(ceil(C/128), 4)]
//       scale_inv[rb][cb] = scale_inv of the tile data[128*rb.., 128*cb..]
//
// (the inner dimension is padded to a multiple of 4 so that every row of scales starts
// 16-byte aligned; the padding is zero). A last block shorter than 128 (R or C not a
// multiple of 128) is a partial block: its scale comes from the elements it has.
//
// The columnwise copy data_t [C, R] is the transpose of data, block-scaled on its own rows:
// with 1x128 blocks that is 128x1 blocks of the original (so data_t's scales differ from
// data's); with 128x128 blocks the tiles are the same and scale_inv_t is scale_inv's
// transpose in the layout above for [C, R].
//
// Dequantization: x[r, c] ~= code[r, c] * scale_inv[block(r, c)], where scale_inv = 1 / scale
// and the codes are sat_rne(x * scale) of the block's scale.
#pragma once

#include <cstdint>

#include "qmesh/export.h"
#include "qmesh/tensor.h"

namespace qmesh {

// The shape of one scaling block.
enum class BlockShape : uint8_t {
  k1x128,    // 128 consecutive elements of one row (activations, gradients)
  k128x128,  // a 128x128 tile (weights)
};

inline constexpr int64_t kScaleBlock = 128;  // the block edge
inline constexpr int64_t kScaleAlign = 4;    // scale rows are padded to this many floats

// The shape of the scale_inv tensor of a [rows, cols] tensor with `block` blocks (above).
QMESH_API Shape block_scale_shape(int64_t rows, int64_t cols, BlockShape block);

struct QMESH_API BlockQuantizedTensorView {
  BlockShape block = BlockShape::k1x128;
  TensorView data;         // FP8 codes [rows, cols]
  TensorView scale_inv;    // fp32, block_scale_shape(rows, cols, block)
  TensorView data_t;       // FP8 [cols, rows]; empty() when there is no columnwise copy
  TensorView scale_inv_t;  // fp32, block_scale_shape(cols, rows, block); with data_t

  DType dtype() const { return data.dtype; }
  Device device() const { return data.device; }
  bool has_columnwise() const { return !data_t.empty(); }
  // Throws qmesh::Error naming `what` unless data is FP8, scale_inv is fp32 of the shape
  // above on data's device, and data_t / scale_inv_t (if present) match likewise.
  void validate(const char* what) const;
};

class QMESH_API BlockQuantizedTensor {
 public:
  BlockQuantizedTensor() = default;
  // Storage for a [rows, cols] tensor of FP8 dtype `fp8` with `block` blocks (and the
  // columnwise copy if `columnwise`). Scales start at 1 (padding 0), codes at 0.
  BlockQuantizedTensor(DType fp8, Shape shape, BlockShape block, Device device, bool columnwise);

  BlockQuantizedTensorView view() const;
  BlockShape block() const { return block_; }
  DType dtype() const { return data_.dtype(); }
  const Shape& shape() const { return data_.shape(); }
  Device device() const { return data_.device(); }
  bool has_columnwise() const { return data_t_.data() != nullptr; }
  const Tensor& data() const { return data_; }
  const Tensor& scale_inv() const { return scale_inv_; }
  const Tensor& data_t() const { return data_t_; }
  const Tensor& scale_inv_t() const { return scale_inv_t_; }

 private:
  BlockShape block_ = BlockShape::k1x128;
  Tensor data_;
  Tensor scale_inv_;
  Tensor data_t_;
  Tensor scale_inv_t_;
};

}  // namespace qmesh
