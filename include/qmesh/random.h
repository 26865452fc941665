// Counter-based random numbers: a sample is a pure function of (seed, index), so a tensor
// sharded over ranks can be drawn slice by slice and match the unsharded draw exactly, and a
// resumed run regenerates the same data without saved generator state.
#pragma once

#include <cstdint>

#include "qmesh/export.h"

namespace qmesh {

// A standard-normal sample for (seed, index): splitmix64 hashing feeding Box-Muller.
QMESH_API float counter_normal(uint64_t seed, uint64_t index);
// A new seed for sub-stream `stream` of `seed` (e.g. one per training step).
QMESH_API uint64_t mix_seed(uint64_t seed, uint64_t stream);

}  // namespace qmesh
