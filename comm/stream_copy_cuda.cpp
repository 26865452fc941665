#include "stream_copy_cuda.h"

#include <cuda_runtime_api.h>

#include "qmesh/cuda_check.h"

namespace qmesh::comm_detail::cuda {

void copy_between(const Endpoint& dst, const Endpoint& src, size_t bytes) {
  if (src.device.is_cuda()) {
    QMESH_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(src.stream.handle)));
  }
  auto* stream =
      static_cast<cudaStream_t>(dst.device.is_cuda() ? dst.stream.handle : src.stream.handle);
  QMESH_CHECK_CUDA(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDefault, stream));
  QMESH_CHECK_CUDA(cudaStreamSynchronize(stream));
}

}  // namespace qmesh::comm_detail::cuda
