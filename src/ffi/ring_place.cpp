#include "ffi/ring_place.h"

namespace qmesh::ffi {

RingPlace ring_place(const Where& w, int64_t comm, const AnyBuffer& coords) {
  if (w.device.is_host()) return {rank_of(comm, coords), {}};
  Rank& rank = rank_on_device(comm, w.device.index);
  return {rank, {w.stream, rank.transfers->get()}};
}

}  // namespace qmesh::ffi
