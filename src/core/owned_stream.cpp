#include "qmesh/owned_stream.h"

#include <utility>

#include "core/cuda_runtime.h"
#include "core/stream_cleanup.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"

namespace qmesh {

OwnedStream::OwnedStream(Device device) : device_(device) {
  QMESH_CHECK(device.is_cuda(), "OwnedStream needs a CUDA device, got ", device.str());
  require_device(device);
  detail::on_cuda(device.index,
                  [&](auto index) { stream_.handle = detail::cuda::create_stream(index); });
}

OwnedStream::~OwnedStream() {
  if (stream_.handle == nullptr) return;  // moved from; always so in a build without CUDA
  detail::run_stream_cleanups(stream_.handle);
  detail::on_cuda(device_.index, [&](auto) { detail::cuda::destroy_stream(stream_.handle); });
}

OwnedStream::OwnedStream(OwnedStream&& other) noexcept
    : device_(other.device_), stream_(std::exchange(other.stream_, Stream{})) {}

OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(stream_, other.stream_);
  return *this;
}

}  // namespace qmesh
