// Blocking copies between buffers that may live on the host or on CUDA devices, ordered
// after the work already enqueued on the streams that produce and consume them. Used by
// backends that move data with the CPU (local threads, UCX) to carry device buffers.
// Internal to qmesh's comm libraries (exported for the backend libraries).
#pragma once

#include <cstddef>

#include "qmesh/device.h"
#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh::comm_detail {

struct Endpoint {
  void* data = nullptr;
  Device device;
  Stream stream;  // orders access to `data` when it is device memory
};

// Copies `bytes` from src to dst and returns when they have arrived. Host to host is a
// memcpy. Otherwise src's stream is synchronized first (when src is on a device, so that
// its data is complete), the copy is issued on dst's stream (src's when dst is host memory)
// and that stream is synchronized. Error if a device is unusable in this build.
QMESH_API void copy_between(const Endpoint& dst, const Endpoint& src, size_t bytes);

// A host copy of a tensor for host-only algorithms: the tensor itself when it is on the
// host, else a staging buffer filled from the device (on `stream`) at construction and,
// with finish(), written back.
class QMESH_API HostStage {
 public:
  HostStage(const TensorView& t, Stream stream, bool copy_in);
  const TensorView& host() const { return host_; }
  // Writes the host copy back to the device tensor (no-op for a host tensor).
  void finish();

 private:
  TensorView original_;
  Stream stream_;
  Tensor staging_;
  TensorView host_;
};

}  // namespace qmesh::comm_detail
