#include "cuda/device_scalar.h"

#include <cuda_runtime_api.h>

#include <string>

#include "qmesh/cuda_check.h"
#include "qmesh/error.h"

namespace qmesh::detail::cuda {

void require_device_scalar(const void* p, int device, std::string_view what) {
  if (p == nullptr) return;
  cudaPointerAttributes attr{};
  QMESH_CHECK_CUDA(cudaPointerGetAttributes(&attr, p));
  const bool on_device = attr.type == cudaMemoryTypeDevice;
  QMESH_CHECK(
      attr.type == cudaMemoryTypeManaged || (on_device && attr.device == device), what,
      " must point to an fp32 scalar in the memory of cuda:", device, " (the GPU reads it), got ",
      on_device ? concat("memory of cuda:", attr.device) : std::string("host memory"), " at ", p);
}

}  // namespace qmesh::detail::cuda
