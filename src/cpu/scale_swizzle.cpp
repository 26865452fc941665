#include "cpu/scale_swizzle.h"

#include "ops/scale_swizzle_layout.h"

namespace qmesh::detail::cpu {

void swizzle_block_scales(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out) {
  const int64_t bytes = swizzled_scale_bytes(rows, cols);
  for (int64_t o = 0; o < bytes; ++o) {
    const int64_t src = swizzled_scale_source(o, rows, cols);
    out[o] = src < 0 ? uint8_t{0} : in[src];
  }
}

}  // namespace qmesh::detail::cpu
