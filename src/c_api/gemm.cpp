// The C API's quantized tensors, quantization and GEMM plans.
#include "qmesh/ops/gemm.h"

#include <string>

#include "boundary.h"
#include "qmesh/ops/quantize.h"
#include "tensor_view.h"

struct qmesh_gemm_plan {
  qmesh::Gemm gemm;
};

namespace qmesh::capi {
namespace {

QuantizedTensorView to_quantized(const qmesh_quantized_tensor* q, const std::string& what) {
  require(q, what.c_str());
  QuantizedTensorView out;
  out.data = to_view(&q->data, (what + ".data").c_str());
  if (q->data_t.data != nullptr) out.data_t = to_view(&q->data_t, (what + ".data_t").c_str());
  out.scale = q->scale;
  out.scale_inv = q->scale_inv;
  out.amax = q->amax;
  out.validate(what.c_str());
  return out;
}

GemmOperand to_operand(const qmesh_gemm_operand& operand, const std::string& what) {
  if ((operand.plain == nullptr) == (operand.fp8 == nullptr))
    QMESH_THROW(what + ": set exactly one of .plain and .fp8");
  if (operand.plain) return GemmOperand::plain(to_view(operand.plain, (what + ".plain").c_str()));
  return GemmOperand::fp8(to_quantized(operand.fp8, what + ".fp8"));
}

TensorView optional_view(const qmesh_tensor* t, const char* what) {
  return t ? to_view(t, what) : TensorView{};
}

GemmArgs to_args(const qmesh_gemm_args* args) {
  qmesh_gemm_args defaults;
  qmesh_gemm_args_init(&defaults);
  const qmesh_gemm_args c = read_config(args, defaults, sizeof(qmesh_gemm_args), "qmesh_gemm_args");
  GemmArgs out;
  out.a = to_operand(c.a, "args.a");
  out.b = to_operand(c.b, "args.b");
  out.trans_a = c.trans_a ? GemmTranspose::kYes : GemmTranspose::kNo;
  out.trans_b = c.trans_b ? GemmTranspose::kYes : GemmTranspose::kNo;
  out.d = to_view(&c.d, "args.d");
  out.d_scale = c.d_scale;
  out.d_amax = c.d_amax;
  out.alpha = c.alpha;
  out.output = c.accumulate ? GemmOutputMode::kAccumulate : GemmOutputMode::kWrite;
  out.epilogue = static_cast<GemmEpilogue>(checked_enum(
      c.epilogue, QMESH_GEMM_EPILOGUE_NONE, QMESH_GEMM_EPILOGUE_BIAS_GRAD, "args.epilogue"));
  out.bias = optional_view(c.bias, "args.bias");
  out.aux = optional_view(c.aux, "args.aux");
  out.accumulation = c.split_accumulation ? GemmAccumulation::kSplit : GemmAccumulation::kFast;
  return out;
}

}  // namespace
}  // namespace qmesh::capi

using namespace qmesh::capi;

extern "C" {

qmesh_status qmesh_quantize(const qmesh_tensor* x, const qmesh_quantized_tensor* out,
                            void* stream) {
  return guard(__func__, [&] {
    qmesh::quantize(to_view(x, "x"), to_quantized(out, "out"), qmesh::Stream{stream});
  });
}

void qmesh_gemm_args_init(qmesh_gemm_args* args) {
  if (args == nullptr) return;
  *args = qmesh_gemm_args{};
  args->struct_size = sizeof(qmesh_gemm_args);
  args->trans_b = 1;
  args->alpha = 1.0f;
  args->epilogue = QMESH_GEMM_EPILOGUE_NONE;
}

qmesh_status qmesh_gemm_plan_create(const qmesh_gemm_args* args, void* stream,
                                    qmesh_gemm_plan** plan) {
  return guard(__func__, [&] {
    require(plan, "plan");
    auto out = std::make_unique<qmesh_gemm_plan>();
    out->gemm.initialize(to_args(args), nullptr, qmesh::Stream{stream});
    *plan = out.release();
  });
}

qmesh_status qmesh_gemm_plan_destroy(qmesh_gemm_plan* plan) {
  return guard(__func__, [&] { delete plan; });
}

qmesh_status qmesh_gemm_plan_run(qmesh_gemm_plan* plan, void* stream) {
  return guard(__func__, [&] { require(plan, "plan")->gemm.run(qmesh::Stream{stream}); });
}

}  // extern "C"
