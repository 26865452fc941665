// The UCP machinery of one UCX communicator (internal to the UCX backend): a context shared
// by a world and the communicators split from it, and per communicator one worker with its
// endpoints and its progress thread.
//
// Progress design. A put completes only while the target's worker is progressed, and a
// rendezvous send only while the receiver's is, so progress must not depend on what the
// application happens to call. Each Engine runs a progress thread that progresses the worker
// until it is idle, arms the worker's wakeup event and sleeps on it (epoll, at most
// QMESH_UCX_IDLE_POLL_MS as a safety net). Waiting threads progress the worker too (for
// latency), spinning briefly and then sleeping in short steps. The worker is created
// UCS_THREAD_MODE_MULTI, so UCX serializes these threads.
//
// The same thread runs submitted jobs (the ring collectives) one at a time in submission
// order; a job's own waits progress the worker, so progress never stops while one runs.
//
// Multi-step operations (a put followed by its completion signal) are chained through
// defer(): a completion callback never issues UCX calls itself; it queues the next step,
// which runs right after the ucp_worker_progress call that fired it, in the same thread.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "qmesh/comm/deadline.h"

namespace qmesh::ucx_detail {

using Clock = std::chrono::steady_clock;

// A ucp_context with tag, RMA, 64-bit atomics and wakeup features, shared (thread-safely) by
// the workers of a world.
class Context {
 public:
  Context();
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  ucp_context_h handle() const { return handle_; }

 private:
  ucp_context_h handle_ = nullptr;
};

class Engine;

// Completion state of one operation (a request, or a chain of requests).
struct Op {
  explicit Op(std::string what_) : what(std::move(what_)) {}
  // Records the outcome; `error` null means success. Called once.
  void complete(std::exception_ptr error_ = nullptr);
  bool is_done() const { return done.load(std::memory_order_acquire); }

  std::string what;  // e.g. "ucx send to rank 3 (tag 7)"
  std::atomic<bool> done{false};
  std::exception_ptr error;    // written before `done` is set
  size_t expected_bytes = 0;   // receives: the size the message must have
  std::function<void()> next;  // puts: the signal step, run once the data is flushed
  uint64_t operand = 1;        // atomic signal: the value added
  uint64_t reply = 0;          // atomic signal: the fetched value (unused)
  // Ring collectives: the timeout error, known before the job has finished unwinding.
  std::string timeout_note;  // written before `noted` is set
  std::atomic<bool> noted{false};
};

// Remote memory of one peer: where a window's buffer and put counter are, and their keys
// (unpacked for the endpoint to that peer).
struct RemoteRegion {
  uint64_t data_address = 0;
  uint64_t data_bytes = 0;
  uint64_t counter_address = 0;
  ucp_rkey_h data_rkey = nullptr;
  ucp_rkey_h counter_rkey = nullptr;
};

class Engine {
 public:
  explicit Engine(std::shared_ptr<Context> context);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const std::shared_ptr<Context>& context() const { return context_; }
  ucp_worker_h worker() const { return worker_; }
  // The worker address, to be given to the peers.
  const std::string& address() const { return address_; }
  // Creates an endpoint to every rank's worker address (this rank's included). Once.
  void connect(const std::vector<std::string>& addresses);
  ucp_ep_h endpoint(int rank) const { return endpoints_.at(static_cast<size_t>(rank)); }

  // Tagged messages: the receive matches exactly `tag`. Throw at once if UCX refuses.
  std::shared_ptr<Op> tag_send(int peer, const void* data, size_t bytes, ucp_tag_t tag,
                               std::string what);
  std::shared_ptr<Op> tag_recv(void* data, size_t bytes, ucp_tag_t tag, std::string what);
  // Puts `bytes` at `remote.data_address + offset` of `peer`, then (once an endpoint flush
  // says the data has arrived) adds 1 to the peer's counter; completes when the add has
  // executed at the peer.
  std::shared_ptr<Op> put_signal(int peer, const RemoteRegion& remote, size_t offset,
                                 const void* data, size_t bytes, std::string what);

  // Queues a job for the progress thread. Jobs run in submission order; each must bound its
  // own waits and must not throw. Jobs submitted before destruction still run.
  void submit(std::function<void()> job);

  // Completion of the flush of the endpoint to `peer` (run as a deferred step).
  void flushed(int peer, ucs_status_t status);

  // Queues fn to run after the current ucp_worker_progress call (outside UCX callbacks).
  void defer(std::function<void()> fn);
  // One ucp_worker_progress plus the deferred steps it produced; returns the event count.
  unsigned progress();
  // Progresses until done() or the deadline; false on timeout.
  bool wait_until(const std::function<bool()>& done, const Deadline& deadline);

 private:
  void progress_loop();
  // Endpoint flushes of puts: at most one flush per endpoint is in flight, covering every
  // put issued to that peer before it started; puts issued meanwhile wait for the next one
  // (fewer flushes under many small puts). A flush that UCX completes at once, without its
  // callback, is completed through defer().
  struct FlushQueue {
    std::vector<std::shared_ptr<Op>> waiting;  // put, not yet covered by a flush
    std::vector<std::shared_ptr<Op>> covered;  // covered by the flush in flight
    bool in_flight = false;
  };
  void start_flush(int peer);  // flush_mu_ held

  std::shared_ptr<Context> context_;
  ucp_worker_h worker_ = nullptr;
  std::string address_;
  std::vector<ucp_ep_h> endpoints_;
  int epoll_fd_ = -1;
  int idle_poll_ms_ = 1;
  std::mutex deferred_mu_;
  std::vector<std::function<void()>> deferred_;
  std::mutex flush_mu_;
  std::vector<FlushQueue> flush_queues_;  // per peer, guarded by flush_mu_
  std::mutex jobs_mu_;
  std::deque<std::function<void()>> jobs_;  // guarded by jobs_mu_
  bool stop_ = false;                       // guarded by jobs_mu_
  std::thread progress_thread_;
};

}  // namespace qmesh::ucx_detail
