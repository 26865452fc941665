// An owning allocation: 64-byte aligned host memory, or cudaMalloc'd device memory.
#pragma once

#include <cstddef>

#include "qmesh/device.h"
#include "qmesh/export.h"

namespace qmesh {

class QMESH_API Buffer {
 public:
  Buffer() = default;
  // Allocates `bytes` (> 0) on `device`. Throws qmesh::Error when out of memory, when the
  // device is unusable, or when CUDA memory is asked of a build without CUDA.
  Buffer(size_t bytes, Device device);
  ~Buffer();
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }
  Device device() const { return device_; }

 private:
  void release() noexcept;
  void* data_ = nullptr;
  size_t size_ = 0;
  Device device_;
};

}  // namespace qmesh
