// Handles of asynchronous communication (the c10d `Work` idea): every *_async call returns a
// WorkHandle whose wait() has a timeout and rethrows the operation's stored error. Nothing
// in qmesh's communication layer blocks forever.
#pragma once

#include <chrono>
#include <exception>
#include <memory>
#include <optional>
#include <string>

#include "qmesh/comm/deadline.h"
#include "qmesh/export.h"

namespace qmesh {

class Communicator;

// The default timeout of every blocking communication wait: QMESH_COMM_TIMEOUT_S seconds
// (a floating-point number > 0; default 300). Read on each call, so tests may set it.
// Error if the variable is not a positive number. A communicator may override it
// (Communicator::set_timeout).
QMESH_API std::chrono::milliseconds comm_timeout();

// Where a timeout came from, so that a timeout error can say how to change it.
enum class TimeoutSource {
  kEnvironment,   // comm_timeout(): QMESH_COMM_TIMEOUT_S
  kCommunicator,  // set in code with Communicator::set_timeout
};

// One asynchronous operation. For host buffers, completion means the data has arrived (and
// the input may be reused). For device buffers the operation is ordered on the Stream given
// when it was issued; completion means the device part has finished too.
//
// States: pending, then either complete or failed. A failure (the operation's own error, or
// a timeout of wait()) is final: every later test() or wait() rethrows the same error. After
// a timeout the communicator that issued the operation may be unusable (the transfer cannot
// always be taken back); the usual response is to exit the process.
//
// A Work may be waited on by one thread at a time. Destroying an unfinished Work:
// - host transfers that have not matched yet (a posted receive) are withdrawn; other host
//   transfers are waited for (bounded by the operation's timeout; a failure is logged,
//   never thrown), because the buffers they use must outlive them; a failed Work (one whose
//   wait() timed out included) is not waited for again, except a local collective, which
//   runs on a worker thread with the buffers until its own deadline;
// - stream-ordered device work (NCCL) is left to its stream and does not block: the stream
//   keeps the order, and an asynchronous failure surfaces at the communicator's next call.
//
// Backends derive from Work and implement the protected hooks below; the state, the
// deadline loop and the wording of timeout errors live here, alike for every backend.
class QMESH_API Work {
 public:
  virtual ~Work();
  Work(const Work&) = delete;
  Work& operator=(const Work&) = delete;

  // Non-blocking: true when the operation has completed. Rethrows the operation's error
  // (a qmesh::Error) if it failed.
  bool test();

  // Blocks until completion or until `timeout` has passed. Throws qmesh::Error on timeout
  // ("<operation> timed out after <s> s (<where the timeout is set>): <the peer waited for,
  // where known>") or when the operation failed.
  void wait(std::chrono::milliseconds timeout);

  // wait(timeout()).
  void wait();

  // The operation, as errors name it ("MPI all_reduce (rank 0 of 4)").
  const std::string& what() const { return what_; }
  // The timeout in effect when the operation was issued (its communicator's), and where it
  // was set.
  std::chrono::milliseconds timeout() const { return timeout_; }
  TimeoutSource timeout_source() const { return source_; }

 protected:
  using Clock = Deadline::Clock;

  Work(std::string what, std::chrono::milliseconds timeout, TimeoutSource source);
  // With the timeout (and its source) of `issuer`, the communicator the operation runs on.
  Work(std::string what, const Communicator& issuer);

  // One non-blocking step of progress: true once the operation has completed. Throws the
  // operation's error (Work records it).
  virtual bool poll() = 0;

  // Blocks until the operation completes (true) or `deadline` passes (false); throws the
  // operation's error. The default polls, yielding for the first 20 ms and then sleeping
  // 100 us between polls (leaving the cores to other ranks on an oversubscribed node).
  virtual bool block_until(const Deadline& deadline);

  // Called once when a wait of `timeout` has passed its deadline: cancels what can be
  // cancelled and returns what follows "timed out after <s> s (...): " in the error, naming
  // the peer waited for where the backend knows it; std::nullopt when the operation turned
  // out to have completed after all. May instead throw an error of its own (recorded as the
  // operation's failure). The default names no peer.
  virtual std::optional<std::string> on_timeout(std::chrono::milliseconds timeout);

  // For the destructor policy: takes back an unfinished operation that has not matched yet
  // (a posted receive), so that it never touches its buffers. True when withdrawn (or found
  // complete meanwhile); false (the default) when it must be waited for.
  virtual bool withdraw() { return false; }

  // The destructor policy above, for the destructor of a backend's Work to call first (the
  // hooks are gone once ~Work runs): nothing for a finished or failed operation; otherwise
  // withdraw(), or else wait(timeout()) and log a failure. Never throws.
  void drop_unfinished() noexcept;

  // "<what> timed out after <s> s (<source>)": the opening of every timeout error.
  std::string timeout_text(std::chrono::milliseconds timeout) const;

 private:
  [[noreturn]] void fail(std::exception_ptr error);  // records the failure and rethrows it

  std::string what_;
  std::chrono::milliseconds timeout_;
  TimeoutSource source_;
  bool done_ = false;
  std::exception_ptr error_;
};

using WorkHandle = std::unique_ptr<Work>;

}  // namespace qmesh
