// The CPU backend of the NVFP4 casts (cpu/nvfp4_cast.cpp); arguments are checked by the callers.
#pragma once

#include <cstdint>

#include "ops/nvfp4_cast_job.h"

namespace qmesh::detail::cpu {

void nvfp4_cast(const NvFp4CastJob& job);
// out[i, j] = nvfp4::decode_element of a [rows, cols] copy (packed codes, E4M3 scales, per-tensor
// decode scale *scale_inv) into fp32, bf16 or fp16.
void nvfp4_dequantize(const uint8_t* data, const uint8_t* scale, const float* scale_inv,
                      int64_t rows, int64_t cols, void* out, DType out_dtype);

}  // namespace qmesh::detail::cpu
