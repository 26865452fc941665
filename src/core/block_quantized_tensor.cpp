#include "qmesh/block_quantized_tensor.h"

#include <string>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/error.h"

namespace qmesh {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

// Scale tensor of the given shape on `device`: the first `used` columns of every row are 1,
// the padding 0.
Tensor initial_scales(const Shape& shape, int64_t used, Device device) {
  std::vector<float> host(static_cast<size_t>(shape.numel()), 0.0f);
  for (int64_t i = 0; i < shape.rows(); ++i)
    for (int64_t j = 0; j < used; ++j) host[static_cast<size_t>(i * shape.cols() + j)] = 1.0f;
  Tensor t(DType::kFloat32, shape, device);
  copy_bytes(t.data(), device, host.data(), Device::host(), host.size() * sizeof(float));
  return t;
}

Tensor zeros(DType dtype, const Shape& shape, Device device) {
  Tensor t(dtype, shape, device);
  std::vector<unsigned char> host(t.nbytes(), 0);
  copy_bytes(t.data(), device, host.data(), Device::host(), host.size());
  return t;
}

// Columns of block_scale_shape(rows, cols, block) that hold scales (the rest is padding).
int64_t used_scale_cols(int64_t rows, int64_t cols, BlockShape block) {
  return block == BlockShape::k1x128 ? rows : ceil_div(cols, kScaleBlock);
}

void check_part(const TensorView& data, const TensorView& scale_inv, const Shape& shape,
                BlockShape block, DType fp8, Device device, const std::string& what) {
  check_not_empty(data, what);
  check_dtype(data, fp8, what);
  check_device(data, device, what);
  check_shape(data, shape, what);
  check_not_empty(scale_inv, what + " scale_inv");
  check_dtype(scale_inv, DType::kFloat32, what + " scale_inv");
  check_device(scale_inv, device, what + " scale_inv");
  check_shape(scale_inv, block_scale_shape(shape.rows(), shape.cols(), block), what + " scale_inv");
}

}  // namespace

Shape block_scale_shape(int64_t rows, int64_t cols, BlockShape block) {
  QMESH_CHECK(rows > 0 && cols > 0, "a block-scaled tensor needs rows and cols > 0, got [", rows,
              ", ", cols, "]");
  if (block == BlockShape::k1x128)
    return Shape{ceil_div(cols, kScaleBlock), round_up(rows, kScaleAlign)};
  QMESH_CHECK(block == BlockShape::k128x128, "unknown BlockShape ", static_cast<int>(block));
  return Shape{ceil_div(rows, kScaleBlock), round_up(ceil_div(cols, kScaleBlock), kScaleAlign)};
}

void BlockQuantizedTensorView::validate(const char* what) const {
  check_not_empty(data, what);
  QMESH_CHECK(is_fp8(data.dtype), what, " must hold FP8 codes (fp8e4m3 or fp8e5m2), got ",
              dtype_name(data.dtype));
  const Shape shape{data.shape.rows(), data.shape.cols()};
  check_part(data, scale_inv, shape, block, data.dtype, data.device, what);
  QMESH_CHECK(data_t.empty() == scale_inv_t.empty(), what,
              " has a columnwise copy without its scales, or scales without the copy");
  if (data_t.empty()) return;
  check_part(data_t, scale_inv_t, Shape{shape.cols(), shape.rows()}, block, data.dtype, data.device,
             std::string(what) + " columnwise data");
}

BlockQuantizedTensor::BlockQuantizedTensor(DType fp8, Shape shape, BlockShape block, Device device,
                                           bool columnwise)
    : block_(block) {
  QMESH_CHECK(is_fp8(fp8), "a block-quantized tensor needs an FP8 dtype, got ", dtype_name(fp8));
  const int64_t rows = shape.rows(), cols = shape.cols();
  data_ = zeros(fp8, shape, device);
  scale_inv_ = initial_scales(block_scale_shape(rows, cols, block),
                              used_scale_cols(rows, cols, block), device);
  if (!columnwise) return;
  data_t_ = zeros(fp8, Shape{cols, rows}, device);
  scale_inv_t_ = initial_scales(block_scale_shape(cols, rows, block),
                                used_scale_cols(cols, rows, block), device);
}

BlockQuantizedTensorView BlockQuantizedTensor::view() const {
  BlockQuantizedTensorView v;
  v.block = block_;
  v.data = data_.view();
  v.scale_inv = scale_inv_.view();
  if (has_columnwise()) {
    v.data_t = data_t_.view();
    v.scale_inv_t = scale_inv_t_.view();
  }
  return v;
}

}  // namespace qmesh
