// The CUDA backend of the block-scaled casts (cuda/block_cast.cu); arguments are checked by
// the callers. Each call makes `device` current, enqueues on `stream` and returns at once.
#pragma once

#include <cstdint>

#include "ops/block_cast_job.h"
#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

void block_cast(int device, const BlockCastJob& job, Stream stream);
// As cpu::block_dequantize, on CUDA device `device`.
void block_dequantize(int device, const uint8_t* in, DType fp8, BlockShape block,
                      const float* scale_inv, int64_t scale_ld, int64_t rows, int64_t cols,
                      void* out, DType out_dtype, Stream stream);

}  // namespace qmesh::detail::cuda
