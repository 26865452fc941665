// The host twin of the scale swizzle (cpu/scale_swizzle.cpp); arguments are checked by the
// caller (ops/scale_swizzle.h).
#pragma once

#include <cstdint>

namespace qmesh::detail::cpu {

// out (swizzled_scale_bytes(rows, cols) bytes) = the swizzled form of the row-major
// [rows, cols] scales `in` (ops/scale_swizzle_layout.h), padding 0.
void swizzle_block_scales(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out);

}  // namespace qmesh::detail::cpu
