#include "cuda/device_arch.h"

#include <cuda_runtime.h>

#include "qmesh/cuda_check.h"

namespace qmesh::detail::cuda {

DeviceArch device_arch(int device) {
  cudaDeviceProp prop{};
  QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  return DeviceArch{prop.name, prop.major, prop.minor};
}

}  // namespace qmesh::detail::cuda
