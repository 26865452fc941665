#include "ops/gemm_emulation.h"

#include <atomic>
#include <mutex>
#include <string>

#include "qmesh/error.h"
#include "qmesh/logging.h"
#include "qmesh/ops/gemm_emulation.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "qmesh/param.h"

namespace qmesh {

namespace {

QMESH_PARAM(block_emulation_param, "BLOCK_EMULATION", 0)

std::atomic<int64_t> g_emulated_gemms{0};
std::once_flag g_logged;

}  // namespace

bool block_emulation_from_env() {
  const int64_t v = block_emulation_param();
  QMESH_CHECK(v == 0 || v == 1, "QMESH_BLOCK_EMULATION must be 0 or 1, got ", v);
  return v == 1;
}

int64_t emulated_gemm_count() { return g_emulated_gemms.load(); }

namespace detail {

namespace {

// The operand's copy whose rows run along K, as a rowwise operand: its 1x32 blocks must lie
// along K.
GemmOperand k_contiguous_copy(const GemmOperand& op, bool rows_along_k, const char* what,
                              const char* trans_field) {
  op.mx.validate((std::string("GemmArgs.") + what).c_str());
  MxFp8TensorView copy;
  if (rows_along_k) {
    copy.data = op.mx.data;
    copy.scale = op.mx.scale;
  } else {
    QMESH_CHECK(op.mx.has_columnwise(), "GemmArgs.", what, " is MXFP8 stored with K across its ",
                "rows (", trans_field, "), so the GEMM reads its columnwise copy data_t (the ",
                "1x32 scale blocks must lie along K), but it has none: quantize it with a ",
                "columnwise copy");
    copy.data = op.mx.data_t;
    copy.scale = op.mx.scale_t;
  }
  return GemmOperand::mxfp8(copy);
}

}  // namespace

MicroscaledCopies checked_copies(const GemmArgs& args) {
  QMESH_CHECK(args.a.is_microscaled() && args.b.is_microscaled(),
              "MXFP8 GEMM operands pair only with MXFP8 operands: quantize both GemmArgs.a and "
              ".b with mxfp8_quantize");
  check_not_empty(args.d, "GemmArgs.d");
  QMESH_CHECK(!is_fp8(args.d.dtype), "an MXFP8 GEMM cannot write an FP8 D (got ",
              dtype_name(args.d.dtype), "): write fp32, bf16 or fp16");
  check_device(args.a.stored(), args.d.device, "GemmArgs.a (it must live on D's device)");
  check_device(args.b.stored(), args.d.device, "GemmArgs.b (it must live on D's device)");
  return {k_contiguous_copy(args.a, args.trans_a == GemmTranspose::kNo, "a", "trans_a"),
          k_contiguous_copy(args.b, args.trans_b == GemmTranspose::kYes, "b", "trans_b")};
}

namespace {

// fp32 on the host; bf16 on CUDA, where the tensor cores take it (exact for the codes).
DType dequantized_dtype(const Device& d) {
  return d.is_host() ? DType::kFloat32 : DType::kBFloat16;
}

GemmArgs plain_form(const GemmArgs& args, const TensorView& a, const TensorView& b) {
  GemmArgs plain = args;
  plain.a = GemmOperand::plain(a);
  plain.b = GemmOperand::plain(b);
  plain.trans_a = GemmTranspose::kNo;
  plain.trans_b = GemmTranspose::kYes;
  return plain;
}

TensorView like(const GemmOperand& copy, void* data, DType dtype) {
  return TensorView(data, dtype, copy.mx.data.shape, copy.mx.data.device);
}

// The dequantization that defines the operand's format.
void dequantize_operand(const GemmOperand& copy, const TensorView& out, Stream stream) {
  QMESH_CHECK(copy.is_microscaled(), "emulated GEMM: no dequantization for this operand kind");
  mxfp8_dequantize(copy.mx, out, stream);
}

}  // namespace

bool has_microscaled_operand(const GemmArgs& args) {
  return args.a.is_microscaled() || args.b.is_microscaled();
}

GemmArgs emulated_probe(const GemmArgs& args) {
  const MicroscaledCopies c = checked_copies(args);
  const DType t = dequantized_dtype(args.d.device);
  return plain_form(args, like(c.a, c.a.mx.data.data, t), like(c.b, c.b.mx.data.data, t));
}

EmulatedOperands::EmulatedOperands(const GemmArgs& args) {
  const MicroscaledCopies c = checked_copies(args);
  a_ = c.a;
  b_ = c.b;
  const DType t = dequantized_dtype(args.d.device);
  a_plain_ = Tensor(t, a_.mx.data.shape, args.d.device);
  b_plain_ = Tensor(t, b_.mx.data.shape, args.d.device);
  plain_ = plain_form(args, a_plain_.view(), b_plain_.view());
}

void EmulatedOperands::refresh(Stream stream) const {
  dequantize_operand(a_, a_plain_.view(), stream);
  dequantize_operand(b_, b_plain_.view(), stream);
  ++g_emulated_gemms;
  std::call_once(g_logged, [&] {
    QMESH_LOG_WARN("GEMMs with MXFP8 operands run EMULATED on ", plain_.d.device.str(),
                   " (each operand dequantized to ", dtype_name(a_plain_.dtype()),
                   ", then a GEMM with fp32 accumulation): the format's numerics, not its speed");
  });
}

}  // namespace detail

}  // namespace qmesh
