// A CUDA stream that an object owns: created on construction, destroyed with the object.
#pragma once

#include "qmesh/device.h"
#include "qmesh/export.h"
#include "qmesh/stream.h"

namespace qmesh {

class QMESH_API OwnedStream {
 public:
  // Creates a stream on CUDA `device` with cudaStreamCreate, so it synchronizes with the
  // legacy default stream (blocking copies such as copy_tensor stay ordered with its work).
  // Error for the host device, a device this process cannot use, or a build without CUDA.
  explicit OwnedStream(Device device);
  // Destroys the stream; work already enqueued still completes (cudaStreamDestroy). What
  // qmesh cached for the stream (cuBLASLt's workspace) is freed first, after waiting for the
  // stream's work if there is such a cache.
  ~OwnedStream();
  OwnedStream(OwnedStream&& other) noexcept;
  OwnedStream& operator=(OwnedStream&& other) noexcept;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;

  Stream get() const { return stream_; }
  Device device() const { return device_; }

 private:
  Device device_;
  Stream stream_;
};

}  // namespace qmesh
