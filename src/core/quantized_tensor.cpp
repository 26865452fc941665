#include "qmesh/quantized_tensor.h"

#include "qmesh/copy.h"

namespace qmesh {

void QuantizedTensorView::validate(const char* what) const {
  check_not_empty(data, what);
  QMESH_CHECK(is_fp8(data.dtype), what, " must hold FP8 codes (fp8e4m3 or fp8e5m2), got ",
              dtype_name(data.dtype));
  QMESH_CHECK(scale && scale_inv && amax, what, " is missing its scale, scale_inv or amax pointer");
  if (data_t.empty()) return;
  check_dtype(data_t, data.dtype, std::string(what) + " columnwise data");
  check_device(data_t, data.device, std::string(what) + " columnwise data");
  check_shape(data_t, Shape{data.shape.cols(), data.shape.rows()},
              std::string(what) + " columnwise data");
}

QuantizedTensor::QuantizedTensor(DType fp8, Shape shape, Device device, bool columnwise)
    : data_(fp8, shape, device), scalars_(DType::kFloat32, Shape{3, kScalarSlot}, device) {
  QMESH_CHECK(is_fp8(fp8), "a quantized tensor needs an FP8 dtype, got ", dtype_name(fp8));
  if (columnwise) data_t_ = Tensor(fp8, Shape{shape.cols(), shape.rows()}, device);
  float initial[3][kScalarSlot] = {};
  initial[0][0] = 1.0f;  // scale
  initial[1][0] = 1.0f;  // scale_inv; amax starts at 0
  copy_bytes(scalars_.data(), device, initial, Device::host(), sizeof(initial));
}

QuantizedTensorView QuantizedTensor::view() const {
  QuantizedTensorView v;
  v.data = data_.view();
  if (has_columnwise()) v.data_t = data_t_.view();
  float* s = scalars_.data_as<float>();
  v.scale = s;
  v.scale_inv = s + kScalarSlot;
  v.amax = s + 2 * kScalarSlot;
  return v;
}

}  // namespace qmesh
