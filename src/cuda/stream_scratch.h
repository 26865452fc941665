// Scratch device memory ordered on one stream (internal): cudaMallocAsync on construction,
// cudaFreeAsync on the same stream on destruction, so kernels enqueued on that stream in
// between may use it, and it is released on every exit path (a failed launch check throws).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuda/check.h"

namespace qmesh::detail::cuda {

template <class T>
class StreamScratch {
 public:
  // `count` elements of T on the current device, usable on `stream` from now on.
  StreamScratch(size_t count, cudaStream_t stream) : stream_(stream) {
    QMESH_CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&data_), count * sizeof(T), stream));
  }
  ~StreamScratch() { (void)cudaFreeAsync(data_, stream_); }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;

  T* get() const { return data_; }

 private:
  T* data_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace qmesh::detail::cuda
