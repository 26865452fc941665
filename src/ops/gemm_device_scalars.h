// The device scalars of the native NVFP4 GEMM (docs/design/gemm.md "Native microscaled
// GEMMs"): alpha and beta in the GEMM's device memory, which cuBLASLt reads at launch
// (CUBLASLT_POINTER_MODE_DEVICE), so that alpha can hold the operands' per-tensor decode
// scales without a host synchronization.
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh::detail {

// out[0] = folded_gemm_alpha(alpha, a_scale_inv[0], b_scale_inv[0])
// (ops/gemm_device_scalars_rule.h), out[1] = beta. a_scale_inv and b_scale_inv fp32 [1], out
// fp32 [2], all on one device. Host: computes it at once; CUDA: enqueues one single-thread
// kernel on `stream`. Error for other dtypes, shapes or devices.
QMESH_API void write_gemm_device_scalars(const TensorView& a_scale_inv,
                                         const TensorView& b_scale_inv, float alpha, float beta,
                                         const TensorView& out, Stream stream);

}  // namespace qmesh::detail
