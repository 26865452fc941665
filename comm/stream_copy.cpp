#include "stream_copy.h"

#include <cstring>

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include <cuda_runtime_api.h>

#include "qmesh/cuda_check.h"
#endif

namespace qmesh::comm_detail {

void copy_between(const Endpoint& dst, const Endpoint& src, size_t bytes) {
  if (bytes == 0) return;
  if (dst.device.is_host() && src.device.is_host()) {
    std::memcpy(dst.data, src.data, bytes);
    return;
  }
  require_device(dst.device);
  require_device(src.device);
#if QMESH_WITH_CUDA
  if (src.device.is_cuda()) {
    QMESH_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(src.stream.handle)));
  }
  auto* stream =
      static_cast<cudaStream_t>(dst.device.is_cuda() ? dst.stream.handle : src.stream.handle);
  QMESH_CHECK_CUDA(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDefault, stream));
  QMESH_CHECK_CUDA(cudaStreamSynchronize(stream));
#endif
}

HostStage::HostStage(const TensorView& t, Stream stream, bool copy_in)
    : original_(t), stream_(stream) {
  if (t.device.is_host()) {
    host_ = t;
    return;
  }
  staging_ = Tensor(t.dtype, t.shape, Device::host());
  host_ = staging_.view();
  if (copy_in) copy_between({host_.data, host_.device, {}}, {t.data, t.device, stream}, t.nbytes());
}

void HostStage::finish() {
  if (original_.device.is_host()) return;
  copy_between({original_.data, original_.device, stream_}, {host_.data, host_.device, {}},
               host_.nbytes());
}

}  // namespace qmesh::comm_detail
