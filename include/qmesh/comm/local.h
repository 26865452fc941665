// The local backend: N ranks as threads of one process, talking through shared memory.
// Used for fast, deterministic tests of algorithms and for multi-rank schedules on one GPU.
//
// It carries host buffers, and CUDA buffers when qmesh is built with CUDA (copies are
// issued on the receiving rank's stream after the sending rank's stream is synchronized;
// collectives on device buffers are staged through host memory). It has OneSided.
// Collectives run the ring algorithms of comm/algorithms on a worker thread per
// communicator, so *_async calls return at once.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"

namespace qmesh {

// A world of n >= 1 ranks: element r is rank r's communicator, to be used by one thread
// (rank r's). If one rank calls abort_local_world(), pending and later waits of every rank
// of this world (and of communicators split from it) throw at once.
QMESH_API std::vector<std::shared_ptr<Communicator>> make_local_world(int n);

// Makes every wait in the world of `comm` (a local-backend communicator) throw a
// qmesh::Error carrying `reason`. Error if `comm` is not a local communicator.
QMESH_API void abort_local_world(Communicator& comm, const std::string& reason);

// Runs fn(comm) on n threads, one per rank of a fresh local world, and joins them. If a
// rank throws, the world is aborted (so the others do not wait for it until their timeout)
// and the exception of the first failing rank is rethrown after all threads have joined.
QMESH_API void run_local_ranks(int n, const std::function<void(Communicator& comm)>& fn);

}  // namespace qmesh
