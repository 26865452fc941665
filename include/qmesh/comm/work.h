// Handles of asynchronous communication (the c10d `Work` idea): every *_async call returns a
// WorkHandle whose wait() has a timeout and rethrows the operation's stored error. Nothing
// in qmesh's communication layer blocks forever.
#pragma once

#include <chrono>
#include <memory>

#include "qmesh/export.h"

namespace qmesh {

// The default timeout of every blocking communication wait: QMESH_COMM_TIMEOUT_S seconds
// (a floating-point number > 0; default 300). Read on each call, so tests may set it.
// Error if the variable is not a positive number.
QMESH_API std::chrono::milliseconds comm_timeout();

// One asynchronous operation. For host buffers, completion means the data has arrived (and
// the input may be reused). For device buffers the operation is ordered on the Stream given
// when it was issued; completion means the device part has finished too.
//
// A Work may be waited on by one thread at a time. Destroying an unfinished Work:
// - host transfers that have not matched yet (a posted receive) are withdrawn; other host
//   transfers are waited for (bounded by comm_timeout(); a failure is logged, never thrown),
//   because the buffers they use must outlive them — except one whose wait() already timed
//   out: its communicator may be unusable then (see wait()) and the process should exit;
// - stream-ordered device work (NCCL) is left to its stream and does not block: the stream
//   keeps the order, and an asynchronous failure surfaces at the communicator's next call.
class QMESH_API Work {
 public:
  virtual ~Work();

  // Non-blocking: true when the operation has completed. Rethrows the operation's error
  // (a qmesh::Error) if it failed.
  virtual bool test() = 0;

  // Blocks until completion or until `timeout` has passed. Throws qmesh::Error on timeout
  // (naming the operation and the timeout) or when the operation failed. After a timeout
  // the communicator that issued the operation may be unusable (the transfer cannot be
  // taken back); the usual response is to exit the process.
  virtual void wait(std::chrono::milliseconds timeout) = 0;

  // wait(comm_timeout()).
  void wait();
};

using WorkHandle = std::unique_ptr<Work>;

}  // namespace qmesh
