#include "qmesh/copy.h"

#include <cstring>

#include "core/cuda_runtime.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"

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

// The CUDA device a copy is issued on: the destination's, or the source's when dst is on the
// host.
int cuda_device_of(Device dst_device, Device src_device) {
  return dst_device.is_host() ? src_device.index : dst_device.index;
}

}  // namespace

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t bytes) {
  if (copied_on_host(dst, dst_device, src, src_device, bytes)) return;
  detail::on_cuda(cuda_device_of(dst_device, src_device),
                  [&](auto device) { detail::cuda::copy(dst, src, bytes, device); });
}

void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                      size_t bytes, Stream stream) {
  if (copied_on_host(dst, dst_device, src, src_device, bytes)) return;
  detail::on_cuda(cuda_device_of(dst_device, src_device),
                  [&](auto device) { detail::cuda::copy_async(dst, src, bytes, device, stream); });
}

void copy_rows_async(void* dst, size_t dst_pitch, Device dst_device, const void* src,
                     size_t src_pitch, Device src_device, size_t width, size_t rows,
                     Stream stream) {
  if (width == 0 || rows == 0) return;
  QMESH_CHECK(dst != nullptr && src != nullptr, "copy of ", rows, " rows with a null pointer");
  QMESH_CHECK(width <= dst_pitch && width <= src_pitch, "copy of rows of ", width,
              " bytes with pitches ", dst_pitch, " (destination) and ", src_pitch,
              " (source): a pitch must hold a row");
  if (dst_device.is_host() && src_device.is_host()) {
    for (size_t i = 0; i < rows; ++i)
      std::memcpy(static_cast<char*>(dst) + i * dst_pitch,
                  static_cast<const char*>(src) + i * src_pitch, width);
    return;
  }
  require_device(dst_device);
  require_device(src_device);
  detail::on_cuda(cuda_device_of(dst_device, src_device), [&](auto device) {
    detail::cuda::copy_rows_async(dst, dst_pitch, src, src_pitch, width, rows, device, stream);
  });
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
