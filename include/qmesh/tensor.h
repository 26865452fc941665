// Tensors: a non-owning view, and an owning tensor built on a Buffer.
//
// Layout: dense and row-major (C order); the last dimension is contiguous. Views carry no
// strides: an op that needs the transpose gets an explicitly transposed tensor (for FP8 the
// columnwise copy made by cast_transpose).
#pragma once

#include <cstdint>
#include <string_view>

#include "qmesh/buffer.h"
#include "qmesh/device.h"
#include "qmesh/dtype.h"
#include "qmesh/error.h"
#include "qmesh/export.h"
#include "qmesh/shape.h"

namespace qmesh {

struct QMESH_API TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Shape shape;
  Device device;

  TensorView() = default;
  // Throws qmesh::Error if data is null (every Shape has at least one element).
  TensorView(void* data, DType dtype, Shape shape, Device device = Device::host());

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype); }
  bool empty() const { return data == nullptr; }

  // Rows [begin, end) of this row-major view (a row: the last dimension; the others are
  // flattened), as a [end - begin, cols] view of the same memory, on the same device. Error
  // unless 0 <= begin < end <= shape.rows().
  TensorView rows(int64_t begin, int64_t end) const;
  // `shape.numel()` contiguous elements from element `offset` on, as a view of that shape of
  // the same memory, on the same device. Error unless 0 <= offset and
  // offset + shape.numel() <= numel().
  TensorView slice(int64_t offset, Shape shape) const;

  // Typed pointer; Error if T does not store this view's dtype.
  template <class T>
  T* data_as() const {
    QMESH_CHECK(DTypeOf<T>::value == dtype, "tensor of dtype ", dtype_name(dtype), " accessed as ",
                dtype_name(DTypeOf<T>::value));
    return static_cast<T*>(data);
  }
};

// Argument checks shared by ops. `what` names the argument in the error message.
QMESH_API void check_dtype(const TensorView& t, DType expected, std::string_view what);
QMESH_API void check_device(const TensorView& t, const Device& expected, std::string_view what);
QMESH_API void check_shape(const TensorView& t, const Shape& expected, std::string_view what);
QMESH_API void check_not_empty(const TensorView& t, std::string_view what);

// An owning, contiguous tensor.
class QMESH_API Tensor {
 public:
  Tensor() = default;
  // Uninitialized memory for shape.numel() elements of dtype on device.
  Tensor(DType dtype, Shape shape, Device device = Device::host());

  TensorView view() const { return {buffer_.data(), dtype_, shape_, buffer_.device()}; }
  operator TensorView() const { return view(); }  // NOLINT: a tensor is usable as its view
  void* data() const { return buffer_.data(); }
  template <class T>
  T* data_as() const {
    return view().data_as<T>();
  }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  Device device() const { return buffer_.device(); }
  int64_t numel() const { return shape_.numel(); }
  size_t nbytes() const { return buffer_.size(); }

 private:
  DType dtype_ = DType::kFloat32;
  Shape shape_;
  Buffer buffer_;
};

}  // namespace qmesh
