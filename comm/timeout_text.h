// The wording of every communication timeout error, alike on every backend so that users
// (and scripts) recognise it. The opening: "<what> timed out after <seconds> s
// (QMESH_COMM_TIMEOUT_S)", or "(the communicator's timeout)" when it was set in code
// (Communicator::set_timeout). Then, where the backend knows it, the peer the operation waited
// for: every such sentence contains "peer rank <r>" or "peer ranks <r> and <s>" (what
// tests/faults looks for), except MPI's sentence for a job on several hosts
// (unnamed_peer_text). NCCL cannot tell which peer is missing and names none.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "qmesh/comm/work.h"
#include "qmesh/export.h"

namespace qmesh::comm_detail {

QMESH_API std::string timeout_text(std::string_view what, std::chrono::milliseconds limit,
                                   TimeoutSource source);

// How to change a timeout from `source`: "QMESH_COMM_TIMEOUT_S" or "the communicator's
// timeout".
QMESH_API std::string_view timeout_name(TimeoutSource source);

// " (raise <timeout_name> if the job is only slow)": the end of a timeout error that names
// no more precise cause.
QMESH_API std::string slow_job_hint(TimeoutSource source);

// The world rank of each rank of a communicator (element r: rank r's), so that errors name
// both numberings; empty for a communicator numbered as the world is (nothing added).
using WorldRanks = std::vector<int>;

// "peer rank 2", "peer ranks 2 and 3", "peer ranks 1, 2 and 3" (ranks in the given order),
// followed by " (world rank 5)" / " (world ranks 5 and 7)" when `world` maps them.
QMESH_API std::string peer_ranks(const std::vector<int>& ranks, const WorldRanks& world = {});

// "peer ranks 2 and 3 never joined this <op>": ranks that have not called the collective.
QMESH_API std::string never_joined_text(const std::vector<int>& ranks, std::string_view op,
                                        const WorldRanks& world = {});

// A ring step that waited `waited` for `peer` (receiving from it, or for it to take what this
// rank sends), at `where` ("step 1 of 3 of the ring"): "waited 5 s for data from peer rank 2
// in step 1 of 3 of the ring; that rank died, froze, or is itself waiting for another".
QMESH_API std::string ring_wait_text(bool receiving, int peer, std::string_view where,
                                     std::chrono::milliseconds waited,
                                     const WorldRanks& world = {});

// A point-to-point receive from (or send to) `peer` with `tag` that never matched.
QMESH_API std::string p2p_wait_text(bool receiving, int peer, int tag,
                                    const WorldRanks& world = {});

// The ranks that did not answer the roll call that follows a timed-out collective `op`.
// Empty `ranks`: every peer answered (so each is alive, waiting in some operation).
QMESH_API std::string roll_call_text(const std::vector<int>& ranks, std::string_view op,
                                     const WorldRanks& world = {});

// What an MPI timeout of `op` says in a job on several hosts, where no roll call is held (a
// roll-call message across a failed link makes Open MPI abort): "MPI cannot name the peer rank
// this <op> waits for in a job on several hosts: a rank died, froze, or never joined it". The
// one sentence tests/faults accepts in place of "peer rank <r>".
QMESH_API std::string unnamed_peer_text(std::string_view op);

}  // namespace qmesh::comm_detail
