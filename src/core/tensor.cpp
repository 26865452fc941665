#include "qmesh/tensor.h"

namespace qmesh {

TensorView::TensorView(void* data_in, DType dtype_in, Shape shape_in, Device device_in)
    : data(data_in), dtype(dtype_in), shape(std::move(shape_in)), device(device_in) {
  QMESH_CHECK(data != nullptr, "tensor view of shape ", shape.str(),
              " has null data; a view must point at its ", shape.numel(), " elements");
  (void)dtype_size(dtype);  // rejects a dtype value outside the enum
}

void check_dtype(const TensorView& t, DType expected, std::string_view what) {
  QMESH_CHECK(t.dtype == expected, what, " must have dtype ", dtype_name(expected), ", got ",
              dtype_name(t.dtype));
}

void check_device(const TensorView& t, const Device& expected, std::string_view what) {
  QMESH_CHECK(t.device == expected, what, " must be on ", expected.str(), ", got ", t.device.str());
}

void check_shape(const TensorView& t, const Shape& expected, std::string_view what) {
  QMESH_CHECK(t.shape == expected, what, " must have shape ", expected.str(), ", got ",
              t.shape.str());
}

void check_not_empty(const TensorView& t, std::string_view what) {
  QMESH_CHECK(!t.empty(), what, " is an empty view (null data)");
}

Tensor::Tensor(DType dtype, Shape shape, Device device)
    : dtype_(dtype),
      shape_(std::move(shape)),
      buffer_(static_cast<size_t>(shape_.numel()) * dtype_size(dtype), device) {}

}  // namespace qmesh
