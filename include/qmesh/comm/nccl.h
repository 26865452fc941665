// The NCCL backend (library qmesh::comm_nccl; present when built with QMESH_WITH_NCCL): CUDA
// buffers of one device, every operation enqueued on the caller's CUDA stream (stream-native:
// later work on that stream may use the results at once). A Work records a CUDA event after
// the operation; wait() polls the event and ncclCommGetAsyncError against the deadline and,
// on timeout or an asynchronous NCCL error, aborts the communicator (ncclCommAbort) and
// throws; dropping a Work does not wait (work.h). Communicators are created non-blocking, so
// initialization (comm_timeout()) and split (the communicator's timeout()) are bounded too. No
// one-sided capability (one_sided() is nullptr).
//
// Differences from the PointToPoint contract, inherent to NCCL:
// - NCCL matches the messages between two ranks in issue order; tags are range-checked
//   (0..32767) but do not take part in matching, so both sides must issue their messages in
//   the same order.
// - A send holds its stream until the peer's receive runs: issue the two directions of an
//   exchange on different streams, or in an order that pairs them.
// - A send to oneself is an Error (NCCL would block the stream; copy with cudaMemcpyAsync).
// Data movement (all_gather, broadcast, send/recv) carries every dtype, FP8 included, as
// bytes; reductions take fp32, fp64, bf16, fp16 and int32, reduced by NCCL.
#pragma once

#include <memory>

#include "qmesh/comm/bootstrap.h"
#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"

namespace qmesh {

// Collective over `bootstrap` (blocking, bounded by comm_timeout()): an NCCL communicator of
// bootstrap.size() ranks on the calling thread's current CUDA device (cudaSetDevice first),
// this process being bootstrap.rank(). Rank 0's ncclUniqueId travels through the bootstrap.
// Error when the build has no CUDA device available or NCCL fails to initialize.
QMESH_API std::shared_ptr<Communicator> make_nccl_world(Bootstrap& bootstrap);

}  // namespace qmesh
