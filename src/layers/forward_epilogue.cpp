#include "layers/forward_epilogue.h"

namespace qmesh::detail {

DType forward_bias_dtype(bool fp8_operands, DType d_dtype) {
  return fp8_operands ? DType::kBFloat16 : d_dtype;
}

GemmArgs bias_only(const GemmArgs& args) {
  GemmArgs b = args;
  b.epilogue = GemmEpilogue::kBias;
  b.d = args.aux;
  b.aux = {};
  return b;
}

DenseEpilogue choose_forward_epilogue(const GemmArgs& args,
                                      const std::function<bool(const GemmArgs&)>& supported) {
  if (args.epilogue == GemmEpilogue::kNone) return DenseEpilogue::kNone;
  if (supported(args)) return DenseEpilogue::kFused;
  if (args.epilogue == GemmEpilogue::kBiasGeluAux && supported(bias_only(args)))
    return DenseEpilogue::kBiasFused;
  return DenseEpilogue::kSeparate;
}

}  // namespace qmesh::detail
