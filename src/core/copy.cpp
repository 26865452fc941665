#include "qmesh/copy.h"

#include <cstring>

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include "cuda/check.h"
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

}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (copied_on_host(dst, dst_device, src, src_device, bytes)) return;
#if QMESH_WITH_CUDA
  QMESH_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#endif
}

void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                      size_t bytes, Stream stream) {
  if (copied_on_host(dst, dst_device, src, src_device, bytes)) return;
#if QMESH_WITH_CUDA
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
