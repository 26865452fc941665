#include "qmesh/mxfp8_tensor.h"

#include <string>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/error.h"
#include "scaling/mx_scale_rule.h"

namespace qmesh {
namespace {

constexpr uint8_t kUnitScale = 127;  // E8M0 1.0

Tensor filled(DType dtype, const Shape& shape, Device device, uint8_t byte) {
  Tensor t(dtype, shape, device);
  const std::vector<uint8_t> host(t.nbytes(), byte);
  copy_bytes(t.data(), device, host.data(), Device::host(), host.size());
  return t;
}

void check_part(const TensorView& data, const TensorView& scale, DType fp8, Device device,
                int64_t rows, int64_t cols, const std::string& what) {
  check_not_empty(data, what);
  check_dtype(data, fp8, what);
  check_device(data, device, what);
  check_shape(data, Shape{rows, cols}, what);
  check_not_empty(scale, what + " scale");
  check_dtype(scale, DType::kFloat8E8M0, what + " scale");
  check_device(scale, device, what + " scale");
  check_shape(scale, Shape{rows, cols / kMxBlock}, what + " scale");
}

}  // namespace

float e8m0_to_float(uint8_t byte) { return detail::mx_scale_inv(byte); }

uint8_t e8m0_scale_for_amax(float amax, float scaled_max) {
  QMESH_CHECK(scaled_max > 0.0f, "e8m0_scale_for_amax: scaled_max must be > 0, got ", scaled_max);
  return detail::mx_scale_byte(amax, scaled_max);
}

void check_mxfp8_shape(int64_t rows, int64_t cols, const char* what) {
  QMESH_CHECK(rows > 0 && cols > 0 && rows % kMxBlock == 0 && cols % kMxBlock == 0, what,
              ": MXFP8 needs rows and cols that are positive multiples of ", kMxBlock,
              " (one E8M0 scale per 32 elements, in both directions), got [", rows, ", ", cols,
              "]; pad the tensor or choose such sizes");
}

void MxFp8TensorView::validate(const char* what) const {
  check_not_empty(data, what);
  QMESH_CHECK(is_fp8(data.dtype), what, " must hold FP8 codes (fp8e4m3 or fp8e5m2), got ",
              dtype_name(data.dtype));
  const int64_t rows = data.shape.rows(), cols = data.shape.cols();
  check_mxfp8_shape(rows, cols, what);
  check_part(data, scale, data.dtype, data.device, rows, cols, what);
  QMESH_CHECK(data_t.empty() == scale_t.empty(), what,
              " has a columnwise copy without its scales, or scales without the copy");
  if (data_t.empty()) return;
  check_part(data_t, scale_t, data.dtype, data.device, cols, rows,
             std::string(what) + " columnwise data");
}

MxFp8Tensor::MxFp8Tensor(DType fp8, Shape shape, Device device, bool columnwise) {
  QMESH_CHECK(is_fp8(fp8), "an MXFP8 tensor needs an FP8 dtype, got ", dtype_name(fp8));
  const int64_t rows = shape.rows(), cols = shape.cols();
  check_mxfp8_shape(rows, cols, "MxFp8Tensor");
  data_ = filled(fp8, shape, device, 0);
  scale_ = filled(DType::kFloat8E8M0, Shape{rows, cols / kMxBlock}, device, kUnitScale);
  if (!columnwise) return;
  data_t_ = filled(fp8, Shape{cols, rows}, device, 0);
  scale_t_ = filled(DType::kFloat8E8M0, Shape{cols, rows / kMxBlock}, device, kUnitScale);
}

MxFp8TensorView MxFp8Tensor::view() const {
  MxFp8TensorView v;
  v.data = data_.view();
  v.scale = scale_.view();
  if (has_columnwise()) {
    v.data_t = data_t_.view();
    v.scale_t = scale_t_.view();
  }
  return v;
}

}  // namespace qmesh
