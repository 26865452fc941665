// Caller-described tensors (qmesh_tensor) and the C API's tensor functions.
#include "tensor_view.h"

#include <algorithm>
#include <string>
#include <vector>

#include "boundary.h"
#include "qmesh/copy.h"

namespace qmesh::capi {

Device to_device(const qmesh_device& device, const char* what) {
  const std::string name = std::string(what) + ".device.kind";
  checked_enum(device.kind, QMESH_DEVICE_HOST, QMESH_DEVICE_CUDA, name.c_str());
  if (device.kind == QMESH_DEVICE_HOST) return Device::host();
  if (device.index < 0)
    QMESH_THROW(std::string(what) + ".device.index is negative (" + std::to_string(device.index) +
                ")");
  return Device::cuda(device.index);
}

TensorView to_view(const qmesh_tensor* tensor, const char* what) {
  require(tensor, what);
  const std::string name(what);
  checked_enum(tensor->dtype, QMESH_FLOAT32, QMESH_FLOAT64, (name + ".dtype").c_str());
  if (tensor->ndim < 0 || tensor->ndim > QMESH_MAX_DIMS)
    QMESH_THROW(name + ".ndim is " + std::to_string(tensor->ndim) + "; expected 0 to " +
                std::to_string(QMESH_MAX_DIMS));
  std::vector<int64_t> dims(tensor->shape, tensor->shape + tensor->ndim);
  for (int i = 0; i < tensor->ndim; ++i)
    if (dims[size_t(i)] <= 0)
      QMESH_THROW(name + ".shape[" + std::to_string(i) + "] is " + std::to_string(dims[size_t(i)]) +
                  "; dimensions must be positive");
  if (tensor->strides != nullptr) {
    int64_t dense = 1;
    for (int i = tensor->ndim - 1; i >= 0; --i) {
      if (tensor->strides[i] != dense)
        QMESH_THROW(name + ".strides[" + std::to_string(i) + "] is " +
                    std::to_string(tensor->strides[i]) +
                    "; qmesh takes dense row-major tensors (expected " + std::to_string(dense) +
                    ", or pass strides = NULL)");
      dense *= dims[size_t(i)];
    }
  }
  if (tensor->data == nullptr) QMESH_THROW(name + ".data is NULL");
  return TensorView(tensor->data, static_cast<DType>(tensor->dtype), Shape(std::move(dims)),
                    to_device(tensor->device, what));
}

qmesh_tensor to_c(const TensorView& view) {
  qmesh_tensor out{};
  out.data = view.data;
  out.dtype = static_cast<qmesh_dtype>(view.dtype);
  out.ndim = view.shape.rank();
  std::copy(view.shape.dims().begin(), view.shape.dims().end(), out.shape);
  out.device.kind = view.device.is_host() ? QMESH_DEVICE_HOST : QMESH_DEVICE_CUDA;
  out.device.index = view.device.index;
  return out;
}

}  // namespace qmesh::capi

extern "C" {

qmesh_tensor qmesh_host_tensor(void* data, qmesh_dtype dtype, int ndim, const int64_t* shape) {
  qmesh_tensor out{};
  out.data = data;
  out.dtype = dtype;
  out.ndim = ndim;
  if (shape != nullptr && ndim > 0 && ndim <= QMESH_MAX_DIMS)
    std::copy(shape, shape + ndim, out.shape);
  out.device.kind = QMESH_DEVICE_HOST;
  return out;
}

size_t qmesh_tensor_nbytes(const qmesh_tensor* tensor) {
  if (tensor == nullptr || tensor->ndim < 0 || tensor->ndim > QMESH_MAX_DIMS ||
      qmesh::capi::raw_enum(tensor->dtype) < QMESH_FLOAT32 ||
      qmesh::capi::raw_enum(tensor->dtype) > QMESH_FLOAT64)
    return 0;
  size_t n = qmesh::dtype_size(static_cast<qmesh::DType>(tensor->dtype));
  for (int i = 0; i < tensor->ndim; ++i) n *= tensor->shape[i] > 0 ? size_t(tensor->shape[i]) : 0;
  return n;
}

qmesh_status qmesh_tensor_copy(const qmesh_tensor* dst, const qmesh_tensor* src) {
  return qmesh::capi::guard(__func__, [&] {
    qmesh::copy_tensor(qmesh::capi::to_view(dst, "dst"), qmesh::capi::to_view(src, "src"));
  });
}

}  // extern "C"
