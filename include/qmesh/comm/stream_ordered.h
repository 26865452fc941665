// Collectives on device buffers without a host wait where the backend allows it.
// A stream-ordered communicator (Communicator::stream_ordered(): NCCL) with CUDA buffers: the
// operation is enqueued on `stream` and its handle dropped, so the host never waits for the
// device; the result is ready in the stream's order, and a failure surfaces at the
// communicator's next wait (as for every stream-ordered NCCL operation). Otherwise (host
// buffers, or a backend that moves device buffers on the host's behalf) these are the
// blocking forms, bounded by the communicator's timeout(). On a one-rank communicator they
// issue no collective: all_reduce leaves the buffer as it is, all_gather and reduce_scatter
// copy `in` to `out` (ordered on `stream`), so that a one-GPU step never stages through the
// host.
#pragma once

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"

namespace qmesh {

// Whether an operation of `comm` on `buf` completes in the order of the stream it was issued
// on, so that the host need not wait for it: CUDA buffers on a stream-ordered communicator.
QMESH_API bool completes_in_stream_order(const Communicator& comm, const TensorView& buf);

QMESH_API void all_reduce_in_stream_order(Communicator& comm, const TensorView& buf, ReduceOp op,
                                          Stream stream);
QMESH_API void all_gather_in_stream_order(Communicator& comm, const TensorView& in,
                                          const TensorView& out, Stream stream);
// Rank r's out is chunk r of the element-wise sum of every rank's `in` (one rank: a copy).
QMESH_API void reduce_scatter_in_stream_order(Communicator& comm, const TensorView& in,
                                              const TensorView& out, Stream stream);

}  // namespace qmesh
