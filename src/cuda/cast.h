// The CUDA backend of the cast ops (cuda/cast.cu); arguments are checked by the callers.
#pragma once

#include <cstdint>
#include <span>

#include "ops/cast_job.h"
#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

// Run on CUDA device `device` (made current for the call), ordered on `stream`.
void cast(int device, const CastSpec& spec, std::span<const CastJob> jobs, Stream stream);
void dequantize(int device, const uint8_t* in, DType fp8, const float* scale_inv, void* out,
                DType out_dtype, int64_t n, Stream stream);

}  // namespace qmesh::detail::cuda
