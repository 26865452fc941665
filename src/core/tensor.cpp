#include "qmesh/tensor.h"

#include <utility>

namespace qmesh {

TensorView::TensorView(void* data_in, DType dtype_in, Shape shape_in, Device device_in)
    : data(data_in), dtype(dtype_in), shape(std::move(shape_in)), device(device_in) {
  QMESH_CHECK(data != nullptr, "tensor view of shape ", shape.str(),
              " has null data; a view must point at its ", shape.numel(), " elements");
  (void)dtype_size(dtype);  // rejects a dtype value outside the enum
}

TensorView TensorView::rows(int64_t begin, int64_t end) const {
  QMESH_CHECK(0 <= begin && begin < end && end <= shape.rows(), "rows [", begin, ", ", end,
              ") of a tensor of shape ", shape.str(), ": take a non-empty range within its ",
              shape.rows(), " rows");
  const int64_t cols = shape.cols();
  return slice(begin * cols, Shape{end - begin, cols});
}

TensorView TensorView::slice(int64_t offset, Shape slice_shape) const {
  QMESH_CHECK(0 <= offset && offset <= numel() && slice_shape.numel() <= numel() - offset,
              "slice of ", slice_shape.numel(), " elements (shape ", slice_shape.str(),
              ") from element ", offset, " of a tensor of shape ", shape.str(), ": it has ",
              numel(), " elements; take a slice within them");
  auto* base = static_cast<char*>(data) + offset * static_cast<int64_t>(dtype_size(dtype));
  return TensorView(base, dtype, std::move(slice_shape), device);
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
