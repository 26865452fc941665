// Collectives on device buffers without a host wait where the backend allows it.
// A stream-ordered communicator (Communicator::stream_ordered(): NCCL) with CUDA buffers: the
// operation is enqueued on `stream` and its handle dropped, so the host never waits for the
// device; the result is ready in the stream's order, and a failure surfaces at the
// communicator's next wait (as for every stream-ordered NCCL operation). Otherwise (host
// buffers, or a backend that moves device buffers on the host's behalf) these are the
// blocking forms, bounded by the communicator's timeout().
#pragma once

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"

namespace qmesh {

QMESH_API void all_reduce_in_stream_order(Communicator& comm, const TensorView& buf, ReduceOp op,
                                          Stream stream);
QMESH_API void all_gather_in_stream_order(Communicator& comm, const TensorView& in,
                                          const TensorView& out, Stream stream);

}  // namespace qmesh
