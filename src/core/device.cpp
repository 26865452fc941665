#include "qmesh/device.h"

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include "qmesh/cuda_check.h"
#endif

namespace qmesh {

std::string Device::str() const {
  return is_host() ? std::string("host") : "cuda:" + std::to_string(index);
}

int cuda_device_count() {
#if QMESH_WITH_CUDA
  // Without a driver this returns cudaErrorInsufficientDriver (35) and leaves `count`
  // untouched, hence the initialisation. The sticky error is cleared for later calls.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

void require_device(const Device& device) {
  if (device.is_host()) return;
  const int count = cuda_device_count();
  QMESH_CHECK(device.index >= 0 && device.index < count, "device ", device.str(),
              " is not available: this process sees ", count, " CUDA device(s)",
              QMESH_WITH_CUDA ? "" : " (qmesh was built with QMESH_WITH_CUDA=OFF)");
}

DeviceGuard::DeviceGuard(int index) {
#if QMESH_WITH_CUDA
  int current = 0;
  QMESH_CHECK_CUDA(cudaGetDevice(&current));
  if (current != index) {
    QMESH_CHECK_CUDA(cudaSetDevice(index));
    previous_ = current;
  }
#else
  QMESH_THROW("cannot make CUDA device ", index,
              " current: qmesh was built with QMESH_WITH_CUDA=OFF");
#endif
}

DeviceGuard::DeviceGuard(int index, std::nothrow_t) noexcept {
#if QMESH_WITH_CUDA
  int current = 0;
  if (cudaGetDevice(&current) == cudaSuccess && current != index &&
      cudaSetDevice(index) == cudaSuccess)
    previous_ = current;
#else
  (void)index;
#endif
}

DeviceGuard::~DeviceGuard() {
#if QMESH_WITH_CUDA
  if (previous_ >= 0) (void)cudaSetDevice(previous_);  // a destructor must not throw
#endif
}

void synchronize(const Device& device, Stream stream) {
  if (device.is_host()) return;
  require_device(device);
#if QMESH_WITH_CUDA
  const DeviceGuard guard(device.index);
  QMESH_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)));
#else
  (void)stream;
#endif
}

void order_after(const Device& device, Stream waiter, Stream producer) {
  if (device.is_host() || waiter.handle == producer.handle) return;
  require_device(device);
#if QMESH_WITH_CUDA
  const DeviceGuard guard(device.index);
  cudaEvent_t event = nullptr;
  QMESH_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  cudaError_t status = cudaEventRecord(event, static_cast<cudaStream_t>(producer.handle));
  if (status == cudaSuccess)
    status = cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter.handle), event, 0);
  (void)cudaEventDestroy(event);  // released by CUDA once recorded work completes
  QMESH_CHECK_CUDA(status);
#endif
}

}  // namespace qmesh
