// The CUDA backend of the native NVFP4 GEMM's device scalars (cuda/gemm_device_scalars.cu);
// arguments are checked by the caller (ops/gemm_device_scalars.h). Makes `device` current,
// enqueues on `stream`, returns at once.
#pragma once

#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

// As cpu::write_gemm_device_scalars, on CUDA device `device` (all pointers in its memory).
void write_gemm_device_scalars(int device, const float* a_scale_inv, const float* b_scale_inv,
                               float alpha, float beta, float* out, Stream stream);

}  // namespace qmesh::detail::cuda
