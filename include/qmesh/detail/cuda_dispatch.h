// Host-or-CUDA branches without preprocessor blocks (internal to qmesh's libraries).
//
// The CUDA entry points (detail::cuda::*, declared in the CUDA backends' own headers with
// CUDA-free signatures) are defined only in a build with CUDA. Code that calls them passes a
// generic lambda ([&](auto device_index) {...}) as the CUDA branch: these helpers call it
// only under `if constexpr (kWithCuda)`, so a build without CUDA never instantiates its body
// and never references an undefined entry point, at any optimisation level.
#pragma once

#include "qmesh/config.h"
#include "qmesh/device.h"

namespace qmesh::detail {

// Whether this build has the CUDA backend (QMESH_WITH_CUDA).
inline constexpr bool kWithCuda = QMESH_WITH_CUDA != 0;

// cuda(device_index) in a build with CUDA. In a build without, nothing: the callers get here
// only for a device that require_device accepted, which no CUDA device is in such a build.
template <class Cuda>
void on_cuda(int device_index, [[maybe_unused]] Cuda&& cuda) {
  if constexpr (kWithCuda) cuda(device_index);
}

// host() when `device` is the host; otherwise require_device(device) (Error for an unusable
// device, and for every CUDA device in a build without CUDA), then on_cuda(device.index, cuda).
template <class Host, class Cuda>
void dispatch(const Device& device, Host&& host, Cuda&& cuda) {
  if (device.is_host()) {
    host();
    return;
  }
  require_device(device);
  on_cuda(device.index, cuda);
}

}  // namespace qmesh::detail
