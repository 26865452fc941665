#include "ops/gemm_emulation.h"

#include <atomic>
#include <mutex>
#include <string>

#include "qmesh/error.h"
#include "qmesh/logging.h"
#include "qmesh/ops/gemm_emulation.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "qmesh/ops/nvfp4_quantize.h"
#include "qmesh/param.h"

namespace qmesh {

namespace {

QMESH_PARAM(block_emulation_param, "BLOCK_EMULATION", 0)

std::atomic<int64_t> g_emulated_gemms{0};
std::once_flag g_logged[2];  // MXFP8, NVFP4: the first emulated GEMM of each is logged

}  // namespace

bool block_emulation_from_env() {
  const int64_t v = block_emulation_param();
  QMESH_CHECK(v == 0 || v == 1, "QMESH_BLOCK_EMULATION must be 0 or 1, got ", v);
  return v == 1;
}

int64_t emulated_gemm_count() { return g_emulated_gemms.load(); }

namespace detail {

namespace {

// "MXFP8" or "NVFP4": the format of a microscaled operand, for messages.
const char* format_name(const GemmOperand& op) { return op.is_nvfp4() ? "NVFP4" : "MXFP8"; }

// The operand's copy whose rows run along K, as a rowwise operand: its scale blocks must lie
// along K.
GemmOperand k_contiguous_copy(const GemmOperand& op, bool rows_along_k, const char* what,
                              const char* trans_field) {
  const std::string field = std::string("GemmArgs.") + what;
  if (op.is_nvfp4())
    op.nv.validate(field.c_str());
  else
    op.mx.validate(field.c_str());
  if (!rows_along_k)
    QMESH_CHECK(op.is_nvfp4() ? op.nv.has_columnwise() : op.mx.has_columnwise(), field, " is ",
                format_name(op), " stored with K across its rows (", trans_field,
                "), so the GEMM reads its columnwise copy data_t (the scale blocks must lie ",
                "along K), but it has none: quantize it with a columnwise copy");
  if (op.is_nvfp4()) {
    NvFp4TensorView copy;
    copy.data = rows_along_k ? op.nv.data : op.nv.data_t;
    copy.scale = rows_along_k ? op.nv.scale : op.nv.scale_t;
    copy.scale_inv = rows_along_k ? op.nv.scale_inv : op.nv.scale_inv_t;
    return GemmOperand::nvfp4(copy);
  }
  MxFp8TensorView copy;
  copy.data = rows_along_k ? op.mx.data : op.mx.data_t;
  copy.scale = rows_along_k ? op.mx.scale : op.mx.scale_t;
  return GemmOperand::mxfp8(copy);
}

}  // namespace

MicroscaledCopies checked_copies(const GemmArgs& args) {
  const GemmOperand& first = args.a.is_microscaled() ? args.a : args.b;
  QMESH_CHECK(
      args.a.is_microscaled() && args.b.is_microscaled() && args.a.is_nvfp4() == args.b.is_nvfp4(),
      format_name(first), " GEMM operands pair only with ", format_name(first),
      " operands: quantize both GemmArgs.a and .b with ",
      first.is_nvfp4() ? "nvfp4_quantize" : "mxfp8_quantize");
  check_not_empty(args.d, "GemmArgs.d");
  QMESH_CHECK(!is_fp8(args.d.dtype), "an ", format_name(args.a),
              " GEMM cannot write an FP8 D (got ", dtype_name(args.d.dtype),
              "): write fp32, bf16 or fp16");
  check_device(args.a.stored(), args.d.device, "GemmArgs.a (it must live on D's device)");
  check_device(args.b.stored(), args.d.device, "GemmArgs.b (it must live on D's device)");
  return {k_contiguous_copy(args.a, args.trans_a == GemmTranspose::kNo, "a", "trans_a"),
          k_contiguous_copy(args.b, args.trans_b == GemmTranspose::kYes, "b", "trans_b")};
}

namespace {

// fp32 on the host. On CUDA bf16, which the tensor cores take: exact for MXFP8 (a code times a
// power of two); NVFP4's (code x E4M3 scale) x fp32 tensor scale needs fp32, used where D is
// fp32, while a 16-bit D needs 16-bit operands in cuBLASLt (one more rounding, 2^-9 relative,
// far below E2M1's 2^-2).
DType dequantized_dtype(const TensorView& d, const GemmOperand& op) {
  const bool fp32 = d.device.is_host() || (op.is_nvfp4() && d.dtype == DType::kFloat32);
  return fp32 ? DType::kFloat32 : DType::kBFloat16;
}

GemmArgs plain_form(const GemmArgs& args, const TensorView& a, const TensorView& b) {
  GemmArgs plain = args;
  plain.a = GemmOperand::plain(a);
  plain.b = GemmOperand::plain(b);
  plain.trans_a = GemmTranspose::kNo;
  plain.trans_b = GemmTranspose::kYes;
  return plain;
}

// The [rows, K] plain tensor of the copy's elements.
Shape element_shape(const GemmOperand& copy) {
  if (copy.is_nvfp4()) return Shape{copy.nv.rows(), copy.nv.cols()};
  return copy.mx.data.shape;
}

TensorView like(const GemmOperand& copy, void* data, DType dtype) {
  return TensorView(data, dtype, element_shape(copy), copy.device());
}

// The dequantization that defines the operand's format.
void dequantize_operand(const GemmOperand& copy, const TensorView& out, Stream stream) {
  QMESH_CHECK(copy.is_microscaled(), "emulated GEMM: no dequantization for this operand kind");
  if (copy.is_nvfp4())
    nvfp4_dequantize(copy.nv, out, false, stream);
  else
    mxfp8_dequantize(copy.mx, out, stream);
}

}  // namespace

bool has_microscaled_operand(const GemmArgs& args) {
  return args.a.is_microscaled() || args.b.is_microscaled();
}

GemmArgs emulated_probe(const GemmArgs& args) {
  const MicroscaledCopies c = checked_copies(args);
  const DType t = dequantized_dtype(args.d, c.a);
  return plain_form(args, like(c.a, c.a.stored().data, t), like(c.b, c.b.stored().data, t));
}

EmulatedOperands::EmulatedOperands(const GemmArgs& args) {
  const MicroscaledCopies c = checked_copies(args);
  a_ = c.a;
  b_ = c.b;
  const DType t = dequantized_dtype(args.d, a_);
  a_plain_ = Tensor(t, element_shape(a_), args.d.device);
  b_plain_ = Tensor(t, element_shape(b_), args.d.device);
  plain_ = plain_form(args, a_plain_.view(), b_plain_.view());
}

void EmulatedOperands::refresh(Stream stream) const {
  dequantize_operand(a_, a_plain_.view(), stream);
  dequantize_operand(b_, b_plain_.view(), stream);
  ++g_emulated_gemms;
  std::call_once(g_logged[a_.is_nvfp4()], [&] {
    QMESH_LOG_WARN("GEMMs with ", format_name(a_), " operands run EMULATED on ",
                   plain_.d.device.str(), " (each operand dequantized to ",
                   dtype_name(a_plain_.dtype()),
                   ", then a GEMM with fp32 accumulation): the format's numerics, not its speed");
  });
}

}  // namespace detail

}  // namespace qmesh
