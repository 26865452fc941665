// Where a tensor's memory lives: host memory, or the memory of CUDA device `index`.
#pragma once

#include <new>
#include <string>

#include "qmesh/export.h"
#include "qmesh/stream.h"

namespace qmesh {

struct QMESH_API Device {
  enum class Kind { kHost, kCuda };
  Kind kind = Kind::kHost;
  int index = 0;  // CUDA ordinal; 0 for the host

  static Device host() { return {}; }
  static Device cuda(int index) { return {Kind::kCuda, index}; }
  bool is_host() const { return kind == Kind::kHost; }
  bool is_cuda() const { return kind == Kind::kCuda; }
  bool operator==(const Device&) const = default;
  // "host" or "cuda:N"
  std::string str() const;
};

// Number of usable CUDA devices: 0 when qmesh was built without CUDA, when the machine has no
// GPU, or when no driver is loaded (never throws, never aborts).
QMESH_API int cuda_device_count();

// Throws qmesh::Error if `device` is a CUDA device that this process cannot use.
QMESH_API void require_device(const Device& device);

// Blocks until all work enqueued so far on `stream` of `device` has completed (CUDA errors of
// that work surface here as qmesh::Error). Nothing to wait for on the host.
QMESH_API void synchronize(const Device& device, Stream stream = {});

// Makes CUDA device `index` current for the guard's scope and restores the previous one when
// it ends (qmesh's one device guard). Throws qmesh::Error if the switch fails or this build
// has no CUDA. The std::nothrow form, for cleanup paths, ignores a failed switch.
class QMESH_API DeviceGuard {
 public:
  explicit DeviceGuard(int index);
  DeviceGuard(int index, std::nothrow_t) noexcept;
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;  // the device to restore; -1: none
};

// Work enqueued on `waiter` from now on starts only after all work enqueued on `producer` so
// far has completed (a CUDA event; the host does not wait). Nothing to do on the host or when
// the two are the same stream.
QMESH_API void order_after(const Device& device, Stream waiter, Stream producer);

}  // namespace qmesh
