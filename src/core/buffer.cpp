#include "qmesh/buffer.h"

#include <cstdlib>
#include <new>
#include <utility>

#include "core/cuda_runtime.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"

namespace qmesh {

namespace {
constexpr size_t kHostAlignment = 64;  // a cache line; enough for any SIMD load
}

Buffer::Buffer(size_t bytes, Device device) : size_(bytes), device_(device) {
  QMESH_CHECK(bytes > 0, "buffer size must be > 0 bytes");
  detail::dispatch(
      device,
      [&] {
        const size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
        data_ = std::aligned_alloc(kHostAlignment, rounded);
        QMESH_CHECK(data_ != nullptr, "out of host memory allocating ", bytes, " bytes");
      },
      [&](auto index) { data_ = detail::cuda::allocate(index, bytes); });
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
    detail::on_cuda(device_.index, [&](auto index) { detail::cuda::deallocate(index, data_); });
  }
  data_ = nullptr;
}

}  // namespace qmesh
