#include "qmesh/owned_stream.h"

#include <utility>

#include "core/stream_cleanup.h"
#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#endif

namespace qmesh {

OwnedStream::OwnedStream(Device device) : device_(device) {
  QMESH_CHECK(device.is_cuda(), "OwnedStream needs a CUDA device, got ", device.str());
  require_device(device);
#if QMESH_WITH_CUDA
  const DeviceGuard guard(device.index);
  cudaStream_t stream = nullptr;
  QMESH_CHECK_CUDA(cudaStreamCreate(&stream));
  stream_.handle = stream;
#endif
}

OwnedStream::~OwnedStream() {
#if QMESH_WITH_CUDA
  if (stream_.handle == nullptr) return;
  detail::run_stream_cleanups(stream_.handle);
  cudaStreamDestroy(static_cast<cudaStream_t>(stream_.handle));
#endif
}

OwnedStream::OwnedStream(OwnedStream&& other) noexcept
    : device_(other.device_), stream_(std::exchange(other.stream_, Stream{})) {}

OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  std::swap(device_, other.device_);
  std::swap(stream_, other.stream_);
  return *this;
}

}  // namespace qmesh
