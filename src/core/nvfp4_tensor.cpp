#include "qmesh/nvfp4_tensor.h"

#include <string>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/error.h"

namespace qmesh {
namespace {

Tensor zeros(DType dtype, const Shape& shape, Device device) {
  Tensor t(dtype, shape, device);
  const std::vector<unsigned char> host(t.nbytes(), 0);
  copy_bytes(t.data(), device, host.data(), Device::host(), host.size());
  return t;
}

void check_part(const TensorView& t, DType dtype, const Shape& shape, Device device,
                const std::string& what) {
  check_not_empty(t, what);
  check_dtype(t, dtype, what);
  check_device(t, device, what);
  check_shape(t, shape, what);
}

// The codes, scales and per-tensor scale of one copy of a [rows, cols] tensor.
void check_copy(const TensorView& data, const TensorView& scale, const TensorView& scale_inv,
                int64_t rows, int64_t cols, Device device, const std::string& what) {
  check_part(data, DType::kFloat4E2M1x2, nvfp4_data_shape(rows, cols), device, what);
  check_part(scale, DType::kFloat8E4M3, nvfp4_scale_shape(rows, cols), device, what + " scale");
  check_part(scale_inv, DType::kFloat32, Shape{1}, device, what + " scale_inv");
}

}  // namespace

void check_nvfp4_shape(int64_t rows, int64_t cols, const char* what) {
  QMESH_CHECK(rows > 0 && cols > 0 && rows % kNvFp4Block == 0 && cols % kNvFp4Block == 0, what,
              ": NVFP4 needs rows and cols that are positive multiples of 16, got [", rows, ", ",
              cols, "]; pad the tensor to multiples of 16 first");
}

Shape nvfp4_data_shape(int64_t rows, int64_t cols) {
  check_nvfp4_shape(rows, cols, "nvfp4_data_shape");
  return Shape{rows, cols / 2};
}

Shape nvfp4_scale_shape(int64_t rows, int64_t cols) {
  check_nvfp4_shape(rows, cols, "nvfp4_scale_shape");
  return Shape{rows, cols / kNvFp4Block};
}

void NvFp4TensorView::validate(const char* what) const {
  check_not_empty(data, what);
  check_dtype(data, DType::kFloat4E2M1x2, what);
  check_nvfp4_shape(rows(), cols(), what);
  check_copy(data, scale, scale_inv, rows(), cols(), device(), what);
  QMESH_CHECK(data_t.empty() == scale_t.empty() && data_t.empty() == scale_inv_t.empty(), what,
              " has a columnwise copy without its scales, or scales without the copy");
  if (!has_columnwise()) return;
  check_copy(data_t, scale_t, scale_inv_t, cols(), rows(), device(),
             std::string(what) + " columnwise data");
}

NvFp4Tensor::NvFp4Tensor(Shape shape, Device device, bool columnwise) {
  const int64_t rows = shape.rows(), cols = shape.cols();
  data_ = zeros(DType::kFloat4E2M1x2, nvfp4_data_shape(rows, cols), device);
  scale_ = zeros(DType::kFloat8E4M3, nvfp4_scale_shape(rows, cols), device);
  scale_inv_ = zeros(DType::kFloat32, Shape{1}, device);
  if (!columnwise) return;
  data_t_ = zeros(DType::kFloat4E2M1x2, nvfp4_data_shape(cols, rows), device);
  scale_t_ = zeros(DType::kFloat8E4M3, nvfp4_scale_shape(cols, rows), device);
  scale_inv_t_ = zeros(DType::kFloat32, Shape{1}, device);
}

NvFp4TensorView NvFp4Tensor::view() const {
  NvFp4TensorView v;
  v.data = data_.view();
  v.scale = scale_.view();
  v.scale_inv = scale_inv_.view();
  if (has_columnwise()) {
    v.data_t = data_t_.view();
    v.scale_t = scale_t_.view();
    v.scale_inv_t = scale_inv_t_.view();
  }
  return v;
}

}  // namespace qmesh
