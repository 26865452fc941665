// An NVFP4 tensor (docs/design/nvfp4.md): float4_e2m1fn codes packed two per byte, one E4M3
// decode scale per 16 consecutive elements of a row, and one fp32 per-tensor decode scale.
// For a [rows, cols] tensor (rows and cols multiples of 16), all row-major:
//
//   data      fp4e2m1x2 [rows, cols / 2]   byte k of a row: element 2k in bits 0-3, 2k+1 in 4-7
//   scale     fp8e4m3   [rows, cols / 16]  scale[r][kb]: decode scale of data[r, 16kb .. +16)
//   scale_inv fp32      [1]                per-tensor decode scale (1 / global encode scale)
//
//   x[r, c] ~= (e2m1(data[r, c]) * e4m3(scale[r][c / 16])) * scale_inv
//
// With 16x16 tiles (weights) the 16 rows of a tile hold the same scale, so every consumer
// reads one layout. The columnwise copy data_t [cols, rows / 2], scale_t [cols, rows / 16],
// scale_inv_t [1] is the same format for the transpose (its own per-tensor scale; with the
// random Hadamard transform it holds the transformed values, docs/design/nvfp4.md).
//
// The scales are the plain row-major matrix; cuBLASLt's VEC16_UE4M3 mode reads them swizzled
// in 128x4 tiles, a rearrangement written in docs/design/nvfp4.md.
#pragma once

#include <cstdint>

#include "qmesh/export.h"
#include "qmesh/tensor.h"

namespace qmesh {

inline constexpr int64_t kNvFp4Block = 16;  // elements per E4M3 scale (and tile edge)

// Throws qmesh::Error unless rows and cols are positive multiples of 16 (pad the tensor).
QMESH_API void check_nvfp4_shape(int64_t rows, int64_t cols, const char* what);
// [rows, cols / 2]: the packed codes of a [rows, cols] tensor.
QMESH_API Shape nvfp4_data_shape(int64_t rows, int64_t cols);
// [rows, cols / 16]: its E4M3 scales.
QMESH_API Shape nvfp4_scale_shape(int64_t rows, int64_t cols);

struct QMESH_API NvFp4TensorView {
  TensorView data;         // fp4e2m1x2 nvfp4_data_shape(rows, cols)
  TensorView scale;        // fp8e4m3 nvfp4_scale_shape(rows, cols)
  TensorView scale_inv;    // fp32 [1]
  TensorView data_t;       // fp4e2m1x2 nvfp4_data_shape(cols, rows); empty(): no columnwise copy
  TensorView scale_t;      // fp8e4m3 nvfp4_scale_shape(cols, rows); with data_t
  TensorView scale_inv_t;  // fp32 [1]; with data_t

  int64_t rows() const { return data.shape.rows(); }
  int64_t cols() const { return 2 * data.shape.cols(); }
  Device device() const { return data.device; }
  bool has_columnwise() const { return !data_t.empty(); }
  // Throws qmesh::Error naming `what` unless every part has the dtype and shape above and
  // lives on data's device.
  void validate(const char* what) const;
};

class QMESH_API NvFp4Tensor {
 public:
  NvFp4Tensor() = default;
  // Zeroed storage for the [shape.rows(), shape.cols()] view of `shape` (multiples of 16),
  // with the columnwise copy if `columnwise`.
  NvFp4Tensor(Shape shape, Device device, bool columnwise);

  NvFp4TensorView view() const;
  int64_t rows() const { return data_.shape().rows(); }
  int64_t cols() const { return 2 * data_.shape().cols(); }
  Device device() const { return data_.device(); }
  bool has_columnwise() const { return data_t_.data() != nullptr; }
  const Tensor& data() const { return data_; }
  const Tensor& scale() const { return scale_; }
  const Tensor& scale_inv() const { return scale_inv_; }
  const Tensor& data_t() const { return data_t_; }
  const Tensor& scale_t() const { return scale_t_; }
  const Tensor& scale_inv_t() const { return scale_inv_t_; }

 private:
  Tensor data_, scale_, scale_inv_, data_t_, scale_t_, scale_inv_t_;
};

}  // namespace qmesh
