// The CUDA backend of the scale swizzle (cuda/scale_swizzle.cu); arguments are checked by the
// caller (ops/scale_swizzle.h). Makes `device` current, enqueues on `stream`, returns at once.
#pragma once

#include <cstdint>

#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

// As cpu::swizzle_block_scales, on CUDA device `device` (in and out in its memory).
void swizzle_block_scales(int device, const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out,
                          Stream stream);

}  // namespace qmesh::detail::cuda
