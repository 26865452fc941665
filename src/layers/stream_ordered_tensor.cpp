#include "layers/stream_ordered_tensor.h"

#include <utility>

#include "cuda/stream_memory.h"
#include "qmesh/detail/cuda_dispatch.h"

namespace qmesh {

StreamOrderedTensor::StreamOrderedTensor(StreamOrderedTensor&& other) noexcept
    : host_(std::move(other.host_)),
      view_(std::exchange(other.view_, TensorView())),
      stream_(other.stream_) {}

StreamOrderedTensor& StreamOrderedTensor::operator=(StreamOrderedTensor&& other) noexcept {
  if (this != &other) {
    reset();
    host_ = std::move(other.host_);
    view_ = std::exchange(other.view_, TensorView());
    stream_ = other.stream_;
  }
  return *this;
}

TensorView StreamOrderedTensor::ensure(DType dtype, const Shape& shape, Device device,
                                       Stream stream) {
  if (!empty() && view_.dtype == dtype && view_.shape == shape && view_.device == device)
    return view_;
  reset();
  detail::dispatch(
      device,
      [&] {
        host_ = Tensor(dtype, shape, device);
        view_ = host_.view();
      },
      [&](auto index) {
        const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
        view_ = TensorView(detail::cuda::allocate_in_stream_order(index, bytes, stream), dtype,
                           shape, device);
      });
  stream_ = stream;
  return view_;
}

void StreamOrderedTensor::reset(Stream stream) noexcept {
  if (empty()) return;
  if (view_.device.is_cuda()) {
    detail::on_cuda(view_.device.index, [&](auto index) {
      detail::cuda::free_in_stream_order(index, view_.data, stream);
    });
  }
  host_ = Tensor();
  view_ = TensorView();
}

}  // namespace qmesh
