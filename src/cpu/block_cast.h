// The CPU backend of the block-scaled casts (cpu/block_cast.cpp); arguments are checked by
// the callers.
#pragma once

#include <cstdint>

#include "ops/block_cast_job.h"

namespace qmesh::detail::cpu {

void block_cast(const BlockCastJob& job);
// out[r, c] = decode(in[r, c]) * scale_inv[block of (r, c)] for a [rows, cols] tensor whose
// scales have row stride scale_ld; out is fp32, bf16 or fp16.
void block_dequantize(const uint8_t* in, DType fp8, BlockShape block, const float* scale_inv,
                      int64_t scale_ld, int64_t rows, int64_t cols, void* out, DType out_dtype);

}  // namespace qmesh::detail::cpu
