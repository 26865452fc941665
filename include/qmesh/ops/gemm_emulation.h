// Emulated GEMMs of microscaled operands (docs/design/mxfp8.md "GEMM").
//
// A GEMM whose operands are in a microscaled format (MXFP8: GemmOperand::mxfp8) runs
// natively on compute capability 10.0 and later (Blackwell; docs/design/gemm.md "Native
// microscaled GEMMs"). Elsewhere it runs EMULATED, and only when asked
// (GemmArgs::emulate_microscaled, set by the MXFP8BlockScaling recipe's `emulate`, or
// QMESH_BLOCK_EMULATION=1): each operand's copy contiguous along K is dequantized as its
// format defines (code * block scale; fp32 on the host, bf16 on CUDA, both exact for FP8
// codes times a power-of-two scale) and an ordinary GEMM with fp32 accumulation follows,
// with the same epilogue and output. Without that request such a GEMM is an Error naming
// the device and what it lacks; never a silent fallback. Both operands must be
// microscaled; an FP8 D is refused.
#pragma once

#include <cstdint>

#include "qmesh/export.h"

namespace qmesh {

// QMESH_BLOCK_EMULATION (docs/params.md): 1 allows emulated microscaled GEMMs everywhere.
QMESH_API bool block_emulation_from_env();

// How many GEMMs this process has run emulated (every Gemm::run, gemm() or gemm_planned()
// call with microscaled operands). Thread-safe.
QMESH_API int64_t emulated_gemm_count();

}  // namespace qmesh
