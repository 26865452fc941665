// splitmix64, the hash behind qmesh's counter-based random numbers (qmesh/random.h and the
// stochastic rounding of ops/nvfp4_rules.h), written once for the host and CUDA kernels.
#pragma once

#include <cstdint>

#include "scaling/scale_rules.h"  // QMESH_HOST_DEVICE

namespace qmesh::detail {

QMESH_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace qmesh::detail
