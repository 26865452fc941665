// One-sided transfers: a rank writes straight into a buffer that a peer registered, and the
// peer learns of the arrival through a counter (the capability the collective-GEMM rings
// use). Local threads implement it with memcpy; UCX with ucp_put_nbx + remote keys.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "qmesh/comm/work.h"
#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// A set of buffers, one per rank of a communicator, registered together. Holds the
// registration (and the peers' remote keys); it does not own the buffers, which must outlive
// it. Destroying a window is local (not collective) but no peer may put into it afterwards.
class QMESH_API Window {
 public:
  virtual ~Window();

  // This rank's registered buffer.
  virtual TensorView local() const = 0;
  // Size in bytes of `peer`'s registered buffer.
  virtual size_t peer_bytes(int peer) const = 0;

  // Target side: blocks until at least `count` puts into this rank's buffer have completed
  // that were not consumed by an earlier call, then consumes `count` of them (a counting
  // semaphore). Throws qmesh::Error after `timeout`.
  virtual void wait_puts(uint64_t count, std::chrono::milliseconds timeout) = 0;
  void wait_puts(uint64_t count);  // timeout comm_timeout()
};

class QMESH_API OneSided {
 public:
  virtual ~OneSided();

  // Collective over the communicator (blocking, bounded by its timeout()): every rank
  // registers `local` (sizes may differ between ranks).
  virtual std::shared_ptr<Window> register_window(TensorView local) = 0;

  // Copies `src` into `peer`'s registered buffer of `window` at byte offset `offset`
  // (offset + src.nbytes() <= window.peer_bytes(peer), Error otherwise). For a device `src`
  // the copy is ordered on `stream`. Completion of the work means the data is visible at the
  // peer; at that point the peer's put counter (Window::wait_puts) has been incremented by 1.
  // `src` must stay unmodified until completion. A put to oneself is allowed.
  virtual WorkHandle put_async(Window& window, int peer, size_t offset, TensorView src,
                               Stream stream = {}) = 0;
};

}  // namespace qmesh
