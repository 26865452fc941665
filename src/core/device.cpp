#include "qmesh/device.h"

#include "core/cuda_runtime.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"

namespace qmesh {

std::string Device::str() const {
  return is_host() ? std::string("host") : "cuda:" + std::to_string(index);
}

int cuda_device_count() {
  // A branch on the build alone (no device to dispatch on): the discarded statement of a
  // build without CUDA references no CUDA entry point either.
  if constexpr (detail::kWithCuda) {
    return detail::cuda::device_count();
  } else {
    return 0;
  }
}

void require_device(const Device& device) {
  if (device.is_host()) return;
  const int count = cuda_device_count();
  QMESH_CHECK(device.index >= 0 && device.index < count, "device ", device.str(),
              " is not available: this process sees ", count, " CUDA device(s)",
              detail::kWithCuda ? "" : " (qmesh was built with QMESH_WITH_CUDA=OFF)");
}

DeviceGuard::DeviceGuard(int index) {
  if (!detail::kWithCuda)
    QMESH_THROW_KIND(ErrorKind::kUnsupported, "cannot make CUDA device ", index,
                     " current: qmesh was built with QMESH_WITH_CUDA=OFF");
  detail::on_cuda(index, [&](auto device) { previous_ = detail::cuda::make_current(device); });
}

DeviceGuard::DeviceGuard(int index, std::nothrow_t) noexcept {
  detail::on_cuda(
      index, [&](auto device) { previous_ = detail::cuda::make_current(device, std::nothrow); });
}

DeviceGuard::~DeviceGuard() {
  // A destructor must not throw; without CUDA there is never a device to restore.
  if (previous_ >= 0)
    detail::on_cuda(previous_, [](auto device) { detail::cuda::restore_current(device); });
}

void synchronize(const Device& device, Stream stream) {
  detail::dispatch(
      device, [] {}, [&](auto index) { detail::cuda::synchronize(index, stream); });
}

void order_after(const Device& device, Stream waiter, Stream producer) {
  if (device.is_host() || waiter.handle == producer.handle) return;
  detail::dispatch(
      device, [] {}, [&](auto index) { detail::cuda::order_after(index, waiter, producer); });
}

}  // namespace qmesh
