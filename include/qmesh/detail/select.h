// Branch-free select on 32-bit patterns. The numeric conversions use it instead of `?:`
// because GCC, honouring -ftrapping-math, will not if-convert a ternary whose arm holds a
// float operation, and a loop with a branch does not vectorize.
#pragma once

#include <cstdint>

namespace qmesh::detail {

inline uint32_t select_bits(bool condition, uint32_t if_true, uint32_t if_false) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (if_true & mask) | (if_false & ~mask);
}

}  // namespace qmesh::detail
