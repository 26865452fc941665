// The name and compute capability of a CUDA device (cuda/device_arch.cpp), for choices and
// messages that depend on the architecture.
#pragma once

#include <string>

namespace qmesh::detail::cuda {

struct DeviceArch {
  std::string name;  // e.g. "NVIDIA H100 80GB HBM3"
  int major = 0;     // compute capability major.minor
  int minor = 0;
};

// Throws qmesh::Error if the device cannot be queried.
DeviceArch device_arch(int device);

}  // namespace qmesh::detail::cuda
