#include "qmesh/device.h"

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include <cuda_runtime_api.h>
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

}  // namespace qmesh
