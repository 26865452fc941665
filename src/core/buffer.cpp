#include "qmesh/buffer.h"

#include <cstdlib>
#include <new>
#include <utility>

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include "cuda/check.h"
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
  int previous = 0;
  QMESH_CHECK_CUDA(cudaGetDevice(&previous));
  QMESH_CHECK_CUDA(cudaSetDevice(device.index));
  const cudaError_t status = cudaMalloc(&data_, bytes);
  QMESH_CHECK_CUDA(cudaSetDevice(previous));
  QMESH_CHECK_CUDA(status);
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
    (void)cudaFree(data_);  // a destructor must not throw; cudaFree syncs the device
#endif
  }
  data_ = nullptr;
}

}  // namespace qmesh
