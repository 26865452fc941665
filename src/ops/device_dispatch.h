// Host-or-CUDA dispatch of an op whose arguments are already checked (internal).
#pragma once

#include "qmesh/config.h"
#include "qmesh/device.h"

namespace qmesh::detail {

// Runs `host()` on the host, else `cuda(device index)` after checking that the device is
// usable (Error otherwise; in a build without CUDA, require_device already fails).
template <class Host, class Cuda>
void dispatch(const Device& device, Host&& host, [[maybe_unused]] Cuda&& cuda) {
  if (device.is_host()) {
    host();
    return;
  }
  require_device(device);
#if QMESH_WITH_CUDA
  cuda(device.index);
#endif
}

}  // namespace qmesh::detail
