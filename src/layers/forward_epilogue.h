// Which epilogue a dense layer's forward GEMM runs: the bias (and GELU) fused into the GEMM
// where the backend offers it for these operands, else in separate passes. Kept apart from
// the layer so that the choice is unit-tested on the host with any backend's rules.
#pragma once

#include <functional>

#include "qmesh/export.h"
#include "qmesh/layers/dense.h"
#include "qmesh/ops/gemm.h"

namespace qmesh::detail {

// The bias dtype the forward GEMM asks for: bf16 with FP8 operands (cuBLASLt fuses a bias
// with FP8 inputs only when it is bf16, fp16 with an fp16 D; PyTorch's _scaled_mm has the
// same rule), else D's dtype d_dtype (fp32 or bf16: a plain GEMM's bias has D's dtype).
QMESH_API DType forward_bias_dtype(bool fp8_operands, DType d_dtype);

// `args` is the fused forward GEMM (epilogue kBias, or kBiasGeluAux with aux the
// pre-activation, of D's dtype), with the bias in forward_bias_dtype. `supported` says whether the
// backend runs a GEMM (Gemm::can_implement(...).ok() in the layer). Returns, in order of
// preference: kFused (the whole epilogue in the GEMM), kBiasFused (with GELU: bias fused,
// D = the pre-activation, GELU a separate pass), kSeparate (a plain GEMM, then the bias and
// GELU passes). kNone for args without an epilogue.
QMESH_API DenseEpilogue choose_forward_epilogue(
    const GemmArgs& args, const std::function<bool(const GemmArgs&)>& supported);

// The kBiasFused form of a kBiasGeluAux GEMM: bias only, D = aux (the pre-activation).
QMESH_API GemmArgs bias_only(const GemmArgs& args);

}  // namespace qmesh::detail
