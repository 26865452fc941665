// Makes a CUDA device current for a scope and restores the previous one (internal).
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/check.h"

namespace qmesh::detail::cuda {

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    QMESH_CHECK_CUDA(cudaGetDevice(&previous_));
    if (device != previous_) QMESH_CHECK_CUDA(cudaSetDevice(device));
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }  // cannot throw from a destructor
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace qmesh::detail::cuda
