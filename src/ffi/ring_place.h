// Where a collective-GEMM handler of qmesh.jax runs its ring (collective_gemm_handlers.cpp):
// the rank (communicator and lock) and, for a CUDA call, the two streams of the ring.
//
// Host call: the rank that coords (int32 [2] in host memory) name; no streams (the ring is
// blocking).
// CUDA call: the NCCL rank that this process made on the call's device (a device is one rank
// of a communicator; coords live in device memory and are not read, so that the host never
// waits for the device). The ring's GEMMs, copies and sums run on XLA's stream, where the
// inputs are ready and the outputs are read; its NCCL transfers run on the rank's transfer
// stream, ordered with XLA's stream by events in both directions; the call enqueues and
// returns (include/qmesh/overlap/collective_gemm.h, "CUDA tensors").
#pragma once

#include <cstdint>

#include "ffi/ffi_support.h"
#include "ffi/jax_comm_registry.h"
#include "qmesh/overlap/collective_gemm.h"

namespace qmesh::ffi {

struct RingPlace {
  Rank& rank;
  CollectiveGemmStreams streams;  // {} on the host
};

// The place of a call on `w` of communicator `comm`. Error (kUnsupported, saying what to do)
// for a CUDA call on a communicator without an NCCL rank on its device, e.g. a local one made
// without the mesh's devices.
RingPlace ring_place(const Where& w, int64_t comm, const AnyBuffer& coords);

}  // namespace qmesh::ffi
