// Copies between host and CUDA memory in any direction.
#pragma once

#include <cstddef>

#include "qmesh/device.h"
#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// Copies `bytes` from src (on src_device) to dst (on dst_device). Blocking: returns when
// the data has arrived. A CUDA copy runs on the legacy default stream of dst's device (src's
// when dst is on the host), so it is ordered after work already queued there and on that
// device's blocking streams, but not after streams created with cudaStreamNonBlocking:
// synchronize those first. Error if a CUDA device is involved in a build without CUDA.
QMESH_API void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device,
                          size_t bytes);
// copy_bytes ordered on `stream` when a CUDA device is involved (cudaMemcpyAsync: returns at
// once; host memory must stay valid until the stream reaches the copy). A null stream is the
// legacy default stream of the device copy_bytes would use. Host to host: memcpy, blocking.
QMESH_API void copy_bytes_async(void* dst, Device dst_device, const void* src, Device src_device,
                                size_t bytes, Stream stream);
// copy_bytes_async of `rows` rows of `width` bytes: row i from src + i * src_pitch to
// dst + i * dst_pitch (cudaMemcpy2DAsync; host to host: memcpy per row, blocking).
QMESH_API void copy_rows_async(void* dst, size_t dst_pitch, Device dst_device, const void* src,
                               size_t src_pitch, Device src_device, size_t width, size_t rows,
                               Stream stream);
// Copies a whole tensor; dtype and shape must match (Error naming both otherwise).
QMESH_API void copy_tensor(const TensorView& dst, const TensorView& src);
// A new tensor on `device` holding a copy of src (blocking).
QMESH_API Tensor clone(const TensorView& src, Device device);

}  // namespace qmesh
