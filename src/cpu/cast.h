// The CPU backend of the cast ops (cpu/cast.cpp); arguments are checked by the callers.
#pragma once

#include <cstdint>
#include <span>

#include "ops/cast_job.h"

namespace qmesh::detail::cpu {

void cast(const CastSpec& spec, std::span<const CastJob> jobs);
void dequantize(const uint8_t* in, DType fp8, const float* scale_inv, void* out, DType out_dtype,
                int64_t n);

}  // namespace qmesh::detail::cpu
