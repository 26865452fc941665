// Ring collectives written only against PointToPoint (host buffers). Backends without
// native collectives (local threads, UCX) run these; each call blocks the calling thread
// until done and throws qmesh::Error once `deadline` has passed, naming the peer that a
// timed-out step waited for (and the ranks that never joined, where `absent` says). Internal to
// qmesh's comm libraries (exported for the backend libraries, not installed as a public header).
//
// Bandwidth-optimal rings: all-gather and reduce-scatter move (n-1)/n of the data per rank,
// all-reduce is reduce-scatter followed by all-gather (2(n-1)/n), broadcast is a chain.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/comm/deadline.h"
#include "qmesh/export.h"

namespace qmesh::algorithms {

struct RingContext {
  PointToPoint& p2p;  // must not carry other traffic with `tag` while the ring runs
  int rank = 0;
  int size = 1;
  int tag = 0;
  Deadline deadline;
  std::chrono::milliseconds timeout{};  // the limit `deadline` came from (for messages)
  TimeoutSource timeout_source = TimeoutSource::kEnvironment;  // where it was set
  std::string_view
      what;             // names the operation and rank in errors: "local all_reduce (rank 0 of 4)"
  std::string_view op;  // the collective alone: "all_reduce"
  // Where the backend knows it (local): the ranks that have not called this collective.
  std::function<std::vector<int>()> absent;
  // Optional: told a step's timeout error before the ring unwinds (dropping the step's
  // other transfer may wait for it), so that a waiter can report it at once.
  std::function<void(const std::string&)> on_timeout;
  // Where the backend knows it (local): the world rank of each rank, so that errors name both
  // numberings; empty: the ranks are named as they are.
  std::vector<int> world_ranks;
};

// Shapes as in Collectives (arguments are checked by the caller). Host buffers only.
QMESH_API void ring_all_gather(const RingContext& ctx, const TensorView& in, const TensorView& out);
QMESH_API void ring_reduce_scatter(const RingContext& ctx, const TensorView& in,
                                   const TensorView& out, ReduceOp op);
// Chunks need not divide evenly: chunk c covers elements [c*n/size, (c+1)*n/size).
QMESH_API void ring_all_reduce(const RingContext& ctx, const TensorView& buf, ReduceOp op);
QMESH_API void ring_broadcast(const RingContext& ctx, const TensorView& buf, int root);
// A token around the ring and a chain back: returns once every rank has entered.
QMESH_API void ring_barrier(const RingContext& ctx);

}  // namespace qmesh::algorithms
