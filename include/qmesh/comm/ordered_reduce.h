// Sum reductions whose float order is fixed: every element is summed over the ranks in rank
// order, ((x0 + x1) + x2) + ..., whatever the communicator's size, chunking or backend. The
// backends' own rings (and MPI's algorithms) start each chunk's sum at a different rank, so
// an all-reduce and a reduce-scatter of the same data differ in the last bits; these do not,
// which is what makes data-parallel and fully sharded training bit-identical on the host.
//
// Point-to-point exchanges (each rank sends every other rank the chunk it owns, (n-1)/n of
// the data, like a ring reduce-scatter) on tag kOrderedReduceTag of `comm`. Collective over
// `comm`: every rank calls in the same order. Blocking (except the _async form), bounded by
// comm.timeout(). fp32 host buffers (Error otherwise).
#pragma once

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"
#include "qmesh/tensor.h"

namespace qmesh {

inline constexpr int kOrderedReduceTag = 29001;

// in.numel() == comm.size() * out.numel(): rank r receives chunk r of the sum of every `in`.
QMESH_API void ordered_reduce_scatter(Communicator& comm, const TensorView& in,
                                      const TensorView& out);
// The same, asynchronous: the transfers start now, the sum is written when the handle's
// wait() (or a test() that returns true) completes; in and out must stay alive until then.
QMESH_API WorkHandle ordered_reduce_scatter_async(Communicator& comm, const TensorView& in,
                                                  const TensorView& out);
// In place: every rank's buf becomes the sum of all ranks' buf (chunks as in a ring
// all-reduce: chunk c covers [c*n/size, (c+1)*n/size); each summed in rank order, then
// gathered).
QMESH_API void ordered_all_reduce(Communicator& comm, const TensorView& buf);

}  // namespace qmesh
