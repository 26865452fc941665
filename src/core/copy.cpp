#include "qmesh/copy.h"

#include <cstring>

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#endif

namespace qmesh {

namespace {

// Checks the arguments and copies host to host (true: done); otherwise checks that the
// CUDA devices involved are usable (false: the caller copies through CUDA).
bool copied_on_host(void* dst, Device dst_device, const void* src, Device src_device,
                    size_t bytes) {
  if (bytes == 0) return true;
  QMESH_CHECK(dst != nullptr && src != nullptr, "copy of ", bytes, " bytes with a null pointer");
  if (dst_device.is_host() && src_device.is_host()) {
    std::memcpy(dst, src, bytes);
    return true;
  }
  require_device(dst_device);
  require_device(src_device);
  return false;
}

#if QMESH_WITH_CUDA
// The CUDA device a copy is issued on: the destination's, or the source's when dst is on the
// host.
int cuda_device_of(Device dst_device, Device src_device) {
  return dst_device.is_host() ? src_device.index : dst_device.index;
}
#endif

}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (copied_on_host(dst, dst_device, src, src_device, bytes)) return;
#if QMESH_WITH_CUDA
  // cudaMemcpy alone would not keep the blocking promise: from pageable host memory it may
  // return before the DMA to the device has finished, and device to device it does not block
  // the host at all (CUDA runtime, "API synchronization behavior"). So the copy goes on the
  // legacy default stream of the device involved (made current: that stream is per device,
  // and it orders the copy after the device's blocking streams) and the host waits for it.
  const DeviceGuard guard(cuda_device_of(dst_device, src_device));
  QMESH_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamLegacy));
  QMESH_CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
#endif
}

void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                      size_t bytes, Stream stream) {
  if (copied_on_host(dst, dst_device, src, src_device, bytes)) return;
#if QMESH_WITH_CUDA
  // A null stream is the legacy default stream of the current device: make it dst's (or src's).
  const DeviceGuard guard(cuda_device_of(dst_device, src_device));
  QMESH_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                   static_cast<cudaStream_t>(stream.handle)));
#else
  (void)stream;
#endif
}

void copy_tensor(const TensorView& dst, const TensorView& src) {
  check_not_empty(dst, "copy destination");
  check_not_empty(src, "copy source");
  check_dtype(dst, src.dtype, "copy destination");
  check_shape(dst, src.shape, "copy destination");
  copy_bytes(dst.data, dst.device, src.data, src.device, src.nbytes());
}

Tensor clone(const TensorView& src, Device device) {
  check_not_empty(src, "clone source");
  Tensor out(src.dtype, src.shape, device);
  copy_tensor(out, src);
  return out;
}

}  // namespace qmesh
