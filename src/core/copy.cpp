#include "qmesh/copy.h"

#include <cstring>

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_CUDA
#include "cuda/check.h"
#endif

namespace qmesh {

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (bytes == 0) return;
  QMESH_CHECK(dst != nullptr && src != nullptr, "copy of ", bytes, " bytes with a null pointer");
  if (dst_device.is_host() && src_device.is_host()) {
    std::memcpy(dst, src, bytes);
    return;
  }
  require_device(dst_device);
  require_device(src_device);
#if QMESH_WITH_CUDA
  QMESH_CHECK_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#endif
}

void copy_tensor(const TensorView& dst, const TensorView& src) {
  check_not_empty(dst, "copy destination");
  check_not_empty(src, "copy source");
  check_dtype(dst, src.dtype, "copy destination");
  check_shape(dst, src.shape, "copy destination");
  copy_bytes(dst.data, dst.device, src.data, src.device, src.nbytes());
}

}  // namespace qmesh
