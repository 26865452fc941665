// Communicators: a group of ranks that exchange tensors. Capabilities are small interfaces
// (Collectives, PointToPoint, OneSided) rather than one fat class whose methods throw
// "not supported"; a Communicator always has collectives and point-to-point, and offers
// one-sided transfers through one_sided() when its backend can.
//
// Common contract of every operation below:
// - Asynchronous: it returns a WorkHandle at once (after argument checks, which throw
//   qmesh::Error). The Work keeps the communicator's timeout() of that moment: its wait()
//   and the blocking wrappers wait that long, and so do the backend's internal deadlines.
// - Collective operations must be issued by every rank of the communicator in the same
//   order, with matching dtypes and sizes.
// - Buffers are dense TensorViews; their device must be one the backend carries (host for
//   local/mpi/ucx, CUDA for nccl; local also carries CUDA buffers when built with CUDA).
//   They must stay alive, and inputs unmodified, until the work completes.
// - `stream` orders the operation for device buffers (the work starts after what was
//   enqueued on it before, and what is enqueued after may use the results once wait()
//   returned — or, for stream-native backends like NCCL, right away in stream order). It is
//   ignored for host buffers.
// - Reductions support fp32, fp64, bf16, fp16 and int32 (see reduce_op.h for 16-bit
//   rounding). Data movement (gather, broadcast, send/recv) supports every dtype.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "qmesh/comm/reduce_op.h"
#include "qmesh/comm/work.h"
#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

class OneSided;

class QMESH_API Collectives {
 public:
  virtual ~Collectives();

  // In place: every rank's `buf` becomes the element-wise reduction of all ranks' `buf`.
  virtual WorkHandle all_reduce_async(TensorView buf, ReduceOp op, Stream stream = {}) = 0;
  // out.numel() == size() * in.numel(), same dtype. out is the rank-major concatenation of
  // every rank's `in` (rank r's data at element offset r * in.numel()).
  virtual WorkHandle all_gather_async(TensorView in, TensorView out, Stream stream = {}) = 0;
  // in.numel() == size() * out.numel(), same dtype. Rank r receives chunk r (elements
  // [r * out.numel(), (r + 1) * out.numel())) of the element-wise reduction of all `in`.
  virtual WorkHandle reduce_scatter_async(TensorView in, TensorView out, ReduceOp op,
                                          Stream stream = {}) = 0;
  // Every rank's `buf` becomes root's `buf`. 0 <= root < size().
  virtual WorkHandle broadcast_async(TensorView buf, int root, Stream stream = {}) = 0;
  // Completes when every rank has issued the barrier.
  virtual WorkHandle barrier_async() = 0;

  // Blocking forms: issue, then Work::wait() (the communicator's timeout).
  void all_reduce(TensorView buf, ReduceOp op, Stream stream = {});
  void all_gather(TensorView in, TensorView out, Stream stream = {});
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op, Stream stream = {});
  void broadcast(TensorView buf, int root, Stream stream = {});
  void barrier();
};

// Tagged point-to-point messages. A send matches the receive of the same (peer, tag) on the
// other side; messages between one pair with one tag arrive in issue order. The received
// buffer must have exactly the sent number of bytes (Error otherwise). 0 <= tag <= max_tag().
class QMESH_API PointToPoint {
 public:
  virtual ~PointToPoint();

  virtual WorkHandle send_async(TensorView in, int peer, int tag, Stream stream = {}) = 0;
  virtual WorkHandle recv_async(TensorView out, int peer, int tag, Stream stream = {}) = 0;
  // The largest tag this backend accepts (at least 32767).
  virtual int max_tag() const = 0;

  // Blocking forms: issue, then Work::wait() (the communicator's timeout).
  void send(TensorView in, int peer, int tag, Stream stream = {});
  void recv(TensorView out, int peer, int tag, Stream stream = {});
};

class QMESH_API Communicator : public Collectives, public PointToPoint {
 public:
  ~Communicator() override;

  // This process's (or thread's) rank in [0, size()).
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local", "mpi", "nccl", "ucx".
  virtual std::string_view backend_name() const = 0;

  // True when operations on device buffers complete in stream order (NCCL): work enqueued
  // on the same stream afterwards may use the results without waiting on the Work, and
  // dropping the Work does not block. False when the host drives device transfers (local,
  // which stages or copies them when both sides have posted): wait on the Work first.
  virtual bool stream_ordered() const { return false; }

  // The timeout of this communicator's operations (see the contract above; split and
  // host_ids are bounded by it too): the one given to set_timeout, else comm_timeout()
  // (QMESH_COMM_TIMEOUT_S, read on each call).
  std::chrono::milliseconds timeout() const;
  // kCommunicator once set_timeout has set one (timeout errors then name it instead of the
  // environment variable).
  TimeoutSource timeout_source() const;
  // Sets this communicator's timeout (> 0; Error otherwise) for the operations issued from
  // now on; std::nullopt goes back to comm_timeout(). Communicators made by split() later
  // inherit the setting. Ranks may differ (each bounds its own waits), but usually agree.
  void set_timeout(std::optional<std::chrono::milliseconds> timeout);

  // Collective over this communicator (blocking, bounded by timeout()): ranks with the
  // same color >= 0 form a new communicator, ordered by (key, old rank). A negative color
  // returns nullptr for that rank (as MPI_UNDEFINED does). The new communicator has this
  // one's timeout setting.
  virtual std::shared_ptr<Communicator> split(int color, int key) = 0;

  // Collective (blocking, bounded by timeout()): host_ids()[r] identifies the host of
  // rank r. Hosts are numbered 0, 1, ... in order of their lowest rank. Used by the mesh to
  // warn when a fast axis spans hosts.
  virtual std::vector<int> host_ids() = 0;

  // The one-sided capability, or nullptr when the backend has none. Owned by this
  // communicator.
  virtual OneSided* one_sided() { return nullptr; }

 protected:
  // For split(): gives `child` (null for a negative color) this communicator's timeout
  // setting, and returns it.
  std::shared_ptr<Communicator> with_my_timeout(std::shared_ptr<Communicator> child) const;

 private:
  std::atomic<int64_t> timeout_ms_{0};  // set_timeout's value; 0: unset (comm_timeout())
};

// Checks shared by backends (throw qmesh::Error naming the argument): sizes and dtypes of
// each collective, a peer in range, a tag in [0, max_tag].
namespace comm_check {
QMESH_API void reducible(const TensorView& t, std::string_view what);
QMESH_API void all_gather_args(const TensorView& in, const TensorView& out, int size);
QMESH_API void reduce_scatter_args(const TensorView& in, const TensorView& out, int size);
QMESH_API void peer(int peer, int size, std::string_view what);
QMESH_API void tag(int tag, int max_tag);
// A send's or receive's arguments: a non-empty buffer, a peer in [0, size), a tag in
// [0, max_tag]. `side` is "send" or "receive" (named in the messages).
QMESH_API void message_args(const TensorView& t, int peer, int size, int tag, int max_tag,
                            std::string_view side);
}  // namespace comm_check

}  // namespace qmesh
