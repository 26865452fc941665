// A layer's buffer whose release never synchronizes the device (internal). On CUDA its memory
// is allocated and released in the order of a stream (cudaMallocAsync / cudaFreeAsync): freed
// while GEMMs queued on that stream still read it, it is reused only after they ran, and the
// host does not wait (cudaFree, behind Tensor, synchronizes the whole device). Work on other
// streams that uses it must be ordered after the allocation and before the release (events,
// order_after). On the host it is an ordinary Tensor.
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

class QMESH_API StreamOrderedTensor {  // exported for its unit test
 public:
  StreamOrderedTensor() = default;
  ~StreamOrderedTensor() { reset(); }
  StreamOrderedTensor(StreamOrderedTensor&& other) noexcept;
  StreamOrderedTensor& operator=(StreamOrderedTensor&& other) noexcept;
  StreamOrderedTensor(const StreamOrderedTensor&) = delete;
  StreamOrderedTensor& operator=(const StreamOrderedTensor&) = delete;

  // Holds a [shape] tensor of `dtype` on `device` (allocated in `stream`'s order unless it
  // holds one of that dtype, shape and device already) and returns it.
  TensorView ensure(DType dtype, const Shape& shape, Device device, Stream stream);
  // Releases the memory in the order of the stream it was allocated on, or of `stream`.
  void reset() noexcept { reset(stream_); }
  void reset(Stream stream) noexcept;

  bool empty() const { return view_.data == nullptr; }
  const TensorView& view() const { return view_; }

 private:
  Tensor host_;
  TensorView view_;
  Stream stream_;
};

}  // namespace qmesh
