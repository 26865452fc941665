// The communicators that the collective-GEMM handlers of qmesh.jax run on, registered once
// per (mesh, axis) by python/qmesh/jax/comm_registry.py through the C entry points of
// jax_comm_registry.cpp, and looked up by the handlers with the id and the device's coords.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>

#include "ffi/ffi_support.h"
#include "qmesh/comm/communicator.h"

namespace qmesh::ffi {

// One rank's communicator and the lock that keeps its rings one at a time: a communicator is
// used by one thread at a time, and XLA may run two independent custom calls of one device
// side by side.
struct Rank {
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<std::mutex> busy = std::make_unique<std::mutex>();
};

// Rank coords[1] of group coords[0] (coords: int32 [2], host) of communicator `id`. Error
// for an unknown id, coords outside it, or a rank that another process holds.
Rank& rank_of(int64_t id, const AnyBuffer& coords);

}  // namespace qmesh::ffi
