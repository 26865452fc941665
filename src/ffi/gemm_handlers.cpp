// XLA FFI handler of the quantized GEMM (qmesh::gemm): D = epilogue(alpha · op(A) · op(B)) with
// A and B both FP8 (float8_e4m3fn / float8_e5m2, each with its fp32 scale_inv) or both one
// plain dtype (f32, bf16, f16), and the epilogues of ops/gemm.h. No copies: the GEMM reads and
// writes XLA's buffers.
//
// Operands: a, b (2-D, stored as trans_a / trans_b say; or, for a strided batch of GEMMs
// (GemmArgs::batch), 3-D [batch, rows, cols] like d), a_scale_inv, b_scale_inv (fp32 [1],
// read for FP8 operands only), then the epilogue's inputs. Attributes a_block / b_block say
// how an FP8 operand is scaled: 0 per tensor (scale_inv [1]), 1 in 1x128 blocks, 2 in 128x128
// tiles (scale_inv in the layout of qmesh/block_quantized_tensor.h for the operand as
// stored; a block-scaled operand must be stored contiguous along K, i.e. the TN form). Results: d
// [M, N] (batched: [batch, M, N]; its rank says whether the call is batched), then the
// epilogue's outputs. Per epilogue (the GemmEpilogue value in attribute
// `epilogue`):
//   0 kNone         inputs: -              outputs: -
//   1 kBias         inputs: bias [N]       outputs: -
//   2 kGelu         inputs: -              outputs: -
//   3 kBiasGeluAux  inputs: bias [N]       outputs: aux [M, N] (the pre-activation)
//   4 kDGelu        inputs: aux [M, N]     outputs: -
//   5 kBiasGrad     inputs: -              outputs: dbias [M] (row sums of op(A))
// The host backend reads any layout; the FP8 GEMM on CUDA takes the TN form only (trans_a
// false, trans_b true), which the Python primitive always passes there.
//
// On CUDA the call has one more result after the epilogue's: cuBLASLt's workspace, a uint8
// buffer of at least gemm_workspace_result_bytes() that XLA allocates (and the primitive
// drops); the GEMM uses its first 256-byte-aligned kCublasLtWorkspaceBytes.
// The GEMM runs through gemm_planned: its plan is built at the first call of each problem and
// only re-pointed afterwards, so a call allocates, queries and synchronizes nothing and the
// CUDA handler is declared command-buffer compatible.
#include <cstdint>
#include <string>

#include "cuda/gemm_cublaslt.h"
#include "ffi/ffi_support.h"
#include "qmesh/ops/gemm.h"

namespace qmesh::ffi {
namespace {

constexpr std::initializer_list<DType> kWide = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

// The epilogue tensors an epilogue takes as extra operands and gives as extra results.
struct EpilogueArity {
  int inputs;
  int outputs;
  const char* input_names;   // for messages
  const char* output_names;  // for messages
};

EpilogueArity arity(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return {0, 0, "none", "none"};
    case GemmEpilogue::kBias:
      return {1, 0, "bias [N]", "none"};
    case GemmEpilogue::kGelu:
      return {0, 0, "none", "none"};
    case GemmEpilogue::kBiasGeluAux:
      return {1, 1, "bias [N]", "aux [M, N]"};
    case GemmEpilogue::kDGelu:
      return {1, 0, "aux [M, N]", "none"};
    case GemmEpilogue::kBiasGrad:
      return {0, 1, "none", "dbias [M]"};
  }
  return {0, 0, "none", "none"};
}

GemmEpilogue to_epilogue(int32_t value) {
  QMESH_CHECK(value >= 0 && value <= static_cast<int32_t>(GemmEpilogue::kBiasGrad),
              "epilogue must be a GemmEpilogue value 0..5 (kNone, kBias, kGelu, kBiasGeluAux, "
              "kDGelu, kBiasGrad), not ",
              value);
  return static_cast<GemmEpilogue>(value);
}

}  // namespace

size_t gemm_workspace_result_bytes() {
  return detail::kCublasLtWorkspaceBytes + detail::kCublasLtWorkspaceAlignment;
}

namespace {

AnyBuffer extra_input(const xffi::RemainingArgs& args, size_t i, const char* what) {
  auto b = args.get<AnyBuffer>(i);
  QMESH_CHECK(b.has_value(), "cannot decode ", what, ": ", b.error().message());
  return *b;
}

Result<AnyBuffer> extra_output(const xffi::RemainingRets& rets, size_t i, const char* what) {
  auto b = rets.get<AnyBuffer>(i);
  QMESH_CHECK(b.has_value(), "cannot decode ", what, ": ", b.error().message());
  return *b;
}

void gemm_impl(const Where& w, AnyBuffer a, AnyBuffer b, AnyBuffer a_scale_inv,
               AnyBuffer b_scale_inv, xffi::RemainingArgs inputs, Result<AnyBuffer> d,
               xffi::RemainingRets outputs, bool trans_a, bool trans_b, int32_t epilogue,
               bool split_accumulator, float alpha, int32_t a_block, int32_t b_block) {
  GemmArgs args;
  args.epilogue = to_epilogue(epilogue);
  const char* ename = gemm_epilogue_name(args.epilogue);
  const EpilogueArity want = arity(args.epilogue);
  QMESH_CHECK(inputs.size() == size_t(want.inputs), "epilogue ", ename, " takes ", want.inputs,
              " operand(s) after a, b, a_scale_inv, b_scale_inv (", want.input_names, "), got ",
              inputs.size());
  // On CUDA, cuBLASLt's workspace follows the epilogue's results.
  const size_t workspace_results = w.device.is_host() ? 0 : 1;
  QMESH_CHECK(outputs.size() == size_t(want.outputs) + workspace_results, "epilogue ", ename,
              " gives ", want.outputs, " result(s) after d (", want.output_names, ")",
              workspace_results ? ", and on CUDA then cuBLASLt's workspace (uint8)" : "",
              "; the call has ", outputs.size(), " (qmesh.jax.gemm lowers it so)");
  void* workspace = nullptr;
  if (workspace_results) {
    Result<AnyBuffer> ws = extra_output(outputs, want.outputs, "the workspace");
    QMESH_CHECK(ws->element_type() == xffi::DataType::U8 &&
                    ws->size_bytes() >= gemm_workspace_result_bytes(),
                "the workspace result must be uint8 with at least ", gemm_workspace_result_bytes(),
                " bytes, got ", ws->size_bytes(), " bytes");
    const uintptr_t start = reinterpret_cast<uintptr_t>(ws->untyped_data());
    const uintptr_t align = detail::kCublasLtWorkspaceAlignment;
    workspace = reinterpret_cast<void*>((start + align - 1) / align * align);
  }

  // d [M, N], or [batch, M, N] for a strided batch; a and b then have d's rank.
  const size_t rank = d->dimensions().size();
  QMESH_CHECK(
      rank == 2 || rank == 3,
      "d (the GEMM output) must be [M, N], or [batch, M, N] for a batch of GEMMs, got rank ", rank);
  require_dtype(*d, kWide, "d (the GEMM output)");
  args.d = view(d, w, "d (the GEMM output)");
  args.batch = rank == 3 ? d->dimensions()[0] : 1;
  args.a = gemm_operand(w, a, a_scale_inv, a_block, "a",
                        "a_scale_inv (the FP8 operand a's scale_inv)", rank);
  args.b = gemm_operand(w, b, b_scale_inv, b_block, "b",
                        "b_scale_inv (the FP8 operand b's scale_inv)", rank);
  args.trans_a = trans_a ? GemmTranspose::kYes : GemmTranspose::kNo;
  args.trans_b = trans_b ? GemmTranspose::kYes : GemmTranspose::kNo;
  args.alpha = alpha;
  args.accumulation = split_accumulator ? GemmAccumulation::kSplit : GemmAccumulation::kFast;

  switch (args.epilogue) {
    case GemmEpilogue::kBias:
    case GemmEpilogue::kBiasGeluAux: {
      const AnyBuffer bias = extra_input(inputs, 0, "bias");
      require_dtype(bias, kWide, "bias");
      require_rank(bias, 1, "bias ([N])");
      args.bias = view(bias, w, "bias");
      break;
    }
    case GemmEpilogue::kDGelu: {
      const AnyBuffer aux = extra_input(inputs, 0, "aux");
      require_dtype(aux, kWide, "aux (the saved pre-activation)");
      require_rank(aux, 2, "aux (the saved pre-activation, [M, N])");
      args.aux = view(aux, w, "aux (the saved pre-activation)");
      break;
    }
    default:
      break;
  }
  switch (args.epilogue) {
    case GemmEpilogue::kBiasGeluAux: {
      Result<AnyBuffer> aux = extra_output(outputs, 0, "aux");
      require_dtype(*aux, kWide, "aux (the pre-activation output)");
      require_rank(*aux, 2, "aux (the pre-activation output, [M, N])");
      args.aux = view(aux, w, "aux (the pre-activation output)");
      break;
    }
    case GemmEpilogue::kBiasGrad: {
      Result<AnyBuffer> dbias = extra_output(outputs, 0, "dbias");
      require_dtype(*dbias, kWide, "dbias");
      require_rank(*dbias, 1, "dbias ([M])");
      args.bias = view(dbias, w, "dbias");
      break;
    }
    default:
      break;
  }
  gemm_planned(args, workspace, w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER_WITH_TRAITS(QmeshGemm, qmesh::ffi::gemm_impl,
                              {::xla::ffi::Traits::kCmdBufferCompatible},
                              .Arg<AnyBuffer>()      // a
                                  .Arg<AnyBuffer>()  // b
                                  .Arg<AnyBuffer>()  // a_scale_inv
                                  .Arg<AnyBuffer>()  // b_scale_inv
                                  .RemainingArgs()   // the epilogue's inputs
                                  .Ret<AnyBuffer>()  // d
                                  .RemainingRets()   // the epilogue's outputs
                                  .Attr<bool>("trans_a")
                                  .Attr<bool>("trans_b")
                                  .Attr<int32_t>("epilogue")
                                  .Attr<bool>("split_accumulator")
                                  .Attr<float>("alpha")
                                  .Attr<int32_t>("a_block")
                                  .Attr<int32_t>("b_block"));
