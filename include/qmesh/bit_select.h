// Branch-free selection between two bit patterns. GCC if-converts `c ? a : b` on integers
// only in simple loops; the conversion helpers in fp8.h and float16.h chain several
// selections, and spelling them as masks keeps their loops vectorizable.
#pragma once

#include <cstdint>

namespace qmesh::detail {

// cond ? a : b, computed with a mask (no branch).
inline uint32_t select_bits(bool cond, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(cond);
  return (a & mask) | (b & ~mask);
}

}  // namespace qmesh::detail
