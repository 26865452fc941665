// Emulated GEMMs of microscaled operands (docs/design/mxfp8.md "GEMM", docs/design/nvfp4.md
// "Recipe").
//
// A GEMM whose operands are in a microscaled format (MXFP8: GemmOperand::mxfp8; NVFP4:
// GemmOperand::nvfp4) runs natively on compute capability 10.0 and later (Blackwell;
// docs/design/gemm.md "Native microscaled GEMMs"). Elsewhere it runs EMULATED, and only when
// asked (GemmArgs::emulate_microscaled, set by the MXFP8BlockScaling / NVFP4BlockScaling
// recipe's `emulate`, or QMESH_BLOCK_EMULATION=1): each
// operand's copy contiguous along K is dequantized as its format defines (MXFP8: code * block
// scale, fp32 on the host and bf16 on CUDA, both exact; NVFP4: (code * E4M3 block scale) *
// fp32 tensor scale, fp32 on the host and for an fp32 D on CUDA, bf16 for a 16-bit D there)
// and an ordinary GEMM with fp32 accumulation follows, with the same epilogue and output.
// Without that request such a GEMM is an Error naming the device and what it lacks; never a
// silent fallback. Both operands must be of one microscaled format; an FP8 D is refused.
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
