#include "stream_copy.h"

#include <cstring>

#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"
#include "stream_copy_cuda.h"

namespace qmesh::comm_detail {

void copy_between(const Endpoint& dst, const Endpoint& src, size_t bytes) {
  if (bytes == 0) return;
  if (dst.device.is_host() && src.device.is_host()) {
    std::memcpy(dst.data, src.data, bytes);
    return;
  }
  require_device(dst.device);
  require_device(src.device);
  const int device = dst.device.is_cuda() ? dst.device.index : src.device.index;
  detail::on_cuda(device, [&](auto) { cuda::copy_between(dst, src, bytes); });
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
