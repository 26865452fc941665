// Scratch device memory ordered on one stream (internal): cudaMallocAsync on construction,
// cudaFreeAsync on the same stream on destruction, so kernels enqueued on that stream in
// between may use it, and it is released on every exit path (a failed launch check throws).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "qmesh/cuda_check.h"

namespace qmesh::detail::cuda {

// `bytes` of stream-ordered memory (cudaMallocAsync) from the current device's default pool.
// The first call on a device makes that pool keep the memory freed into it (release
// threshold: unlimited) instead of handing it back to the driver at every synchronization:
// otherwise a scratch buffer allocated every step is mapped again every step (3 ms of a
// 3.5 ms GEMM + reduce-scatter on an H100, docs/benchmarks/gpu-h100.md).
void* stream_alloc(size_t bytes, cudaStream_t stream);

template <class T>
class StreamScratch {
 public:
  // `count` elements of T on the current device, usable on `stream` from now on.
  StreamScratch(size_t count, cudaStream_t stream) : stream_(stream) {
    data_ = static_cast<T*>(stream_alloc(count * sizeof(T), stream));
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
