// The CPU backend of the MXFP8 casts (cpu/mxfp8_cast.cpp); arguments are checked by the callers.
#pragma once

#include "ops/mxfp8_cast_job.h"

namespace qmesh::detail::cpu {

void mxfp8_cast(const MxCastJob& job);
void mxfp8_dequantize(const MxDequantizeJob& job);

}  // namespace qmesh::detail::cpu
