// The UCX backend (library qmesh::comm_ucx; present when built with QMESH_WITH_UCX): host
// buffers over UCP tagged messages, collectives as rings over them, and one-sided puts
// (ucp_put_nbx into memory registered with ucp_mem_map, remote keys exchanged at window
// registration). Transports are chosen by UCX itself from UCX_TLS / UCX_NET_DEVICES.
//
// Progress: each communicator owns one UCP worker and a progress thread that sleeps on the
// worker's wakeup event, so transfers (puts into this rank's windows included) complete
// while the application computes; every wait also progresses the worker itself for
// latency. Every wait is bounded (the communicator's timeout()).
#pragma once

#include <memory>

#include "qmesh/comm/bootstrap.h"
#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"

namespace qmesh {

// Collective over `bootstrap` (blocking, bounded by comm_timeout()): a UCX communicator of
// bootstrap.size() ranks, this process being bootstrap.rank(). The bootstrap carries the
// worker addresses and is not used afterwards (split and window registration go over the
// communicator itself). Throws qmesh::Error when UCX cannot be initialized or no transport
// reaches a peer.
QMESH_API std::shared_ptr<Communicator> make_ucx_world(Bootstrap& bootstrap);

}  // namespace qmesh
