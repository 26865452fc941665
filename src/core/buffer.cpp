#include "qmesh/buffer.h"

#include <cstdlib>
#include <new>
#include <utility>

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#endif

namespace qmesh {

namespace {
constexpr size_t kHostAlignment = 64;  // a cache line; enough for any SIMD load
}

Buffer::Buffer(size_t bytes, Device device) : size_(bytes), device_(device) {
  QMESH_CHECK(bytes > 0, "buffer size must be > 0 bytes");
  if (device.is_host()) {
    const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    data_ = std::aligned_alloc(kHostAlignment, rounded);
    QMESH_CHECK(data_ != nullptr, "out of host memory allocating ", bytes, " bytes");
    return;
  }
  require_device(device);
#if QMESH_WITH_CUDA
  const DeviceGuard guard(device.index);
  QMESH_CHECK_CUDA(cudaMalloc(&data_, bytes));
#endif
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    release();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    device_ = other.device_;
  }
  return *this;
}

void Buffer::release() noexcept {
  if (!data_) return;
  if (device_.is_host()) {
    std::free(data_);
  } else {
#if QMESH_WITH_CUDA
    // A destructor must not throw: errors are ignored. The owning device is made current,
    // as for the allocation (cudaFree synchronizes the current device).
    const DeviceGuard guard(device_.index, std::nothrow);
    (void)cudaFree(data_);
#endif
  }
  data_ = nullptr;
}

}  // namespace qmesh
