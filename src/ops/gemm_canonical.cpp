#include "ops/gemm_canonical.h"

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "qmesh/config.h"
#include "qmesh/error.h"

namespace qmesh::detail {

namespace {

bool is_plain_gemm_dtype(DType t) {
  return t == DType::kFloat32 || t == DType::kBFloat16 || t == DType::kFloat16;
}

const char* transpose_name(GemmTranspose t) { return t == GemmTranspose::kNo ? "kNo" : "kYes"; }

void check_operand_form(const GemmOperand& op, const char* what) {
  const int forms = int(!op.tensor.empty()) + int(op.is_quantized()) + int(op.is_block_scaled());
  QMESH_CHECK(forms == 1, "GemmArgs.", what,
              " must hold exactly one of a plain tensor, a quantized tensor or a block-quantized "
              "tensor (build it with GemmOperand::plain, GemmOperand::fp8 or "
              "GemmOperand::fp8_block); it holds ",
              forms == 0   ? "neither"
              : forms == 2 ? "both"
                           : "all three");
  if (op.is_quantized()) op.quantized.validate(what);
  if (op.is_block_scaled()) op.block.validate(what);
}

bool is_fp8_operand(const GemmOperand& op) { return op.is_quantized() || op.is_block_scaled(); }

// "plain bf16", "per-tensor FP8", "block-scaled FP8": the operand's kind, for messages.
std::string operand_kind(const GemmOperand& op) {
  if (op.is_block_scaled()) return "block-scaled FP8";
  if (op.is_quantized()) return "per-tensor FP8";
  return concat("plain ", dtype_name(op.dtype()));
}

// One batch element's [rows, cols] of a stored matrix: the 2-D view's rows and columns for
// batch 1 (leading dimensions flattened), else the last two dimensions of a [batch, rows,
// cols] view.
std::pair<int64_t, int64_t> element_dims(const TensorView& t, int64_t batch, const char* what) {
  if (batch == 1) return {t.shape.rows(), t.shape.cols()};
  QMESH_CHECK(t.shape.rank() == 3 && t.shape.dims()[0] == batch, "GemmArgs.", what,
              " of a GEMM with batch = ", batch, " must be 3-D [batch, rows, cols] = [", batch,
              ", ...], got shape ", t.shape.str());
  return {t.shape.dims()[1], t.shape.dims()[2]};
}

// Chooses the stored copy of an operand. `k_contiguous` is whether the rowwise data is stored
// with K as its contiguous (last) dimension. `need_k_contiguous` (the cuBLASLt FP8 GEMM, and
// every block-scaled GEMM) takes that layout from the columnwise copy when the rowwise one is
// the other way round.
GemmMatrix choose_copy(const GemmOperand& op, bool k_contiguous, bool need_k_contiguous,
                       const char* what, const char* trans_field, GemmTranspose trans,
                       int64_t batch) {
  GemmMatrix m;
  const bool block = op.is_block_scaled();
  TensorView stored = op.stored();
  TensorView block_scales = op.block.scale_inv;
  m.k_contiguous = k_contiguous;
  if (need_k_contiguous && !k_contiguous) {
    QMESH_CHECK(batch == 1, "GemmArgs.", what, " is FP8 with ", trans_field, " = ",
                transpose_name(trans),
                ", which the FP8 GEMM on CUDA (TN-only) serves from a columnwise copy, but a "
                "GEMM with batch = ",
                batch, " has none per element: store each element of ", what,
                " contiguous along K (transpose each element) and pass trans_a = kNo, trans_b "
                "= kYes");
    const bool has_columnwise = block ? op.block.has_columnwise() : op.quantized.has_columnwise();
    QMESH_CHECK(has_columnwise, "GemmArgs.", what, " is FP8 with ", trans_field, " = ",
                transpose_name(trans),
                block ? ", which a block-scaled GEMM (on every backend: its scale blocks must "
                        "lie along K) reads from the operand's columnwise copy data_t, but "
                      : ", which the FP8 GEMM on CUDA (TN-only) serves from the operand's "
                        "columnwise copy data_t, but ",
                what, " has none: quantize it with a columnwise copy",
                block ? "" : " (cast_transpose)");
    stored = block ? op.block.data_t : op.quantized.data_t;
    block_scales = op.block.scale_inv_t;
    m.k_contiguous = true;
  }
  m.data = stored.data;
  m.dtype = stored.dtype;
  std::tie(m.rows, m.cols) = element_dims(stored, batch, what);
  if (op.is_quantized()) m.scale_inv = op.quantized.scale_inv;
  if (block) {
    m.scale_inv = static_cast<const float*>(block_scales.data);
    m.scaling = op.block.block == BlockShape::k1x128 ? GemmScaling::kBlock1x128
                                                     : GemmScaling::kBlock128x128;
  }
  return m;
}

void check_same_device(const TensorView& t, const Device& device, const char* what) {
  if (!t.empty()) check_device(t, device, what);
}

void check_epilogue_vector(const TensorView& t, int64_t length, const char* what,
                           const char* epilogue) {
  QMESH_CHECK(!t.empty(), "GemmArgs.", what, " must be set for epilogue ", epilogue);
  QMESH_CHECK(is_plain_gemm_dtype(t.dtype), "GemmArgs.", what, " must be fp32, bf16 or fp16, got ",
              dtype_name(t.dtype));
  QMESH_CHECK(t.numel() == length, "GemmArgs.", what, " of epilogue ", epilogue, " must have ",
              length, " elements, got shape ", t.shape.str());
}

void check_alignment(const void* p, const char* what) {
  QMESH_CHECK(reinterpret_cast<uintptr_t>(p) % 16 == 0, "GemmArgs.", what,
              " must be 16-byte aligned for the FP8 GEMM on CUDA, got address ", p);
}

// cuBLASLt's Hopper FP8 rules that can be checked without a GPU.
void check_cublaslt_fp8(const CanonicalGemm& c) {
  QMESH_CHECK(c.k % kCublasLtFp8Alignment == 0,
              "the FP8 GEMM on CUDA needs K (leading dimension "
              "of A and B in the TN form) to be a multiple of ",
              kCublasLtFp8Alignment, ", got K = ", c.k,
              ": pad K, or run on the host backend which accepts any K");
  QMESH_CHECK(c.n % kCublasLtFp8Alignment == 0,
              "the FP8 GEMM on CUDA needs N (leading dimension "
              "of D) to be a multiple of ",
              kCublasLtFp8Alignment, ", got N = ", c.n,
              ": pad N, or run on the host backend which accepts any N");
  check_alignment(c.a.data, "A data");
  check_alignment(c.b.data, "B data");
  check_alignment(c.d, "D");
  if (c.aux) check_alignment(c.aux, "aux");
}

// cuBLASLt's rules for block-scaled operands (Hopper, cuBLASLt 13), as far as they need no
// GPU: docs/design/block_scaling.md "GEMM".
void check_cublaslt_block(const CanonicalGemm& c) {
  QMESH_CHECK(
      !(c.a.scaling == GemmScaling::kBlock128x128 && c.b.scaling == GemmScaling::kBlock128x128),
      "cuBLASLt has no GEMM of two operands with 128x128 blocks: quantize the "
      "activation or gradient operand with 1x128 blocks (BlockShape::k1x128)");
  // cuBLASLt's B' is our A; with 1x128 blocks its other dimension n' = M must be a multiple
  // of 8 (its M' = N is already a multiple of 16).
  QMESH_CHECK(c.a.scaling != GemmScaling::kBlock1x128 || c.m % 8 == 0,
              "the block-scaled GEMM on CUDA needs M to be a multiple of 8 when A has 1x128 "
              "blocks, got M = ",
              c.m, ": pad M, or run on the host backend which accepts any M");
  check_alignment(c.a.scale_inv, "a's block scales (scale_inv)");
  check_alignment(c.b.scale_inv, "b's block scales (scale_inv)");
}

// cuBLASLt's dtype rules for the epilogue tensors: a plain GEMM's bias and aux have D's
// dtype; with an FP8 D, C takes the bias's dtype, which must then be 16-bit.
void check_cublaslt_epilogue_dtypes(const CanonicalGemm& c) {
  if (!c.fp8_inputs()) {
    QMESH_CHECK(!c.bias || c.bias_dtype == c.d_dtype, "on CUDA, the bias of a ",
                dtype_name(c.a.dtype), " GEMM must have D's dtype ", dtype_name(c.d_dtype),
                ", got ", dtype_name(c.bias_dtype));
    QMESH_CHECK(!c.aux || c.aux_dtype == c.d_dtype, "on CUDA, the aux of a ", dtype_name(c.a.dtype),
                " GEMM must have D's dtype ", dtype_name(c.d_dtype), ", got ",
                dtype_name(c.aux_dtype));
  } else if (is_fp8(c.d_dtype)) {
    QMESH_CHECK(!c.bias || c.bias_dtype != DType::kFloat32,
                "on CUDA, the bias of a GEMM with an FP8 D must be bf16 or fp16, got fp32");
  }
}

// cuBLASLt's GELU aux matrix has D's leading dimension N, which must be divisible by 8
// (CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD).
void check_cublaslt_aux(const CanonicalGemm& c) {
  QMESH_CHECK(!c.aux || c.n % 8 == 0, "on CUDA, epilogue ", gemm_epilogue_name(c.epilogue),
              " needs N (the leading dimension of aux) to be a multiple of 8, got N = ", c.n,
              ": pad N, or run the GEMM with kNone and then the bias and gelu ops");
}

}  // namespace

void check_batch(const GemmArgs& args) {
  QMESH_CHECK(args.batch >= 1, "GemmArgs.batch must be >= 1 (1: a single GEMM), got ", args.batch);
  if (args.batch == 1) return;
  for (const auto& [op, what] : {std::pair{&args.a, "a"}, std::pair{&args.b, "b"}})
    QMESH_CHECK_KIND(ErrorKind::kUnsupported, !op->is_block_scaled() && !op->is_microscaled(),
                     "a GEMM with batch = ", args.batch,
                     " takes per-tensor FP8 or plain operands only, but GemmArgs.", what, " is ",
                     op->is_block_scaled() ? "block-scaled FP8"
                     : op->is_nvfp4()      ? "NVFP4"
                                           : "MXFP8",
                     ": run one GEMM per batch element");
  const GemmEpilogue e = args.epilogue;
  QMESH_CHECK_KIND(ErrorKind::kUnsupported,
                   e == GemmEpilogue::kNone || e == GemmEpilogue::kBias || e == GemmEpilogue::kGelu,
                   "a GEMM with batch = ", args.batch,
                   " takes epilogue kNone, kBias or kGelu, got ", gemm_epilogue_name(e),
                   ": run one GEMM per batch element");
  QMESH_CHECK_KIND(ErrorKind::kUnsupported, args.d_amax == nullptr,
                   "a GEMM with batch = ", args.batch,
                   " does not compute the amax of D: leave GemmArgs.d_amax nullptr (take the "
                   "amax of D afterwards) or run one GEMM per batch element");
}

CanonicalGemm batch_element(const CanonicalGemm& c, int64_t i) {
  // Byte offset of element i of a batch of rows × cols matrices of dtype t.
  const auto offset = [i](DType t, int64_t rows, int64_t cols) {
    return size_t(i) * size_t(rows) * size_t(cols) * dtype_size(t);
  };
  CanonicalGemm e = c;
  e.batch = 1;
  e.cm.batch = 1;
  e.cm.stride_a = e.cm.stride_b = e.cm.stride_d = 0;
  e.a.data = static_cast<const char*>(c.a.data) + offset(c.a.dtype, c.a.rows, c.a.cols);
  e.b.data = static_cast<const char*>(c.b.data) + offset(c.b.dtype, c.b.rows, c.b.cols);
  e.d = static_cast<char*>(c.d) + offset(c.d_dtype, c.m, c.n);
  return e;
}

float GemmMatrix::block_scale_inv(int64_t r, int64_t c) const {
  const BlockShape shape =
      scaling == GemmScaling::kBlock1x128 ? BlockShape::k1x128 : BlockShape::k128x128;
  const int64_t ld = block_scale_shape(rows, cols, shape).cols();
  if (shape == BlockShape::k1x128) return scale_inv[(c / kScaleBlock) * ld + r];
  return scale_inv[(r / kScaleBlock) * ld + c / kScaleBlock];
}

CanonicalGemm canonicalize(const GemmArgs& args) {
  check_batch(args);
  check_operand_form(args.a, "a");
  check_operand_form(args.b, "b");
  check_not_empty(args.d, "GemmArgs.d");

  CanonicalGemm c;
  c.batch = args.batch;
  c.device = args.d.device;
  c.backend = c.device.is_host() ? GemmBackend::kHost : GemmBackend::kCublasLt;
  const DType ta = args.a.dtype();
  const DType tb = args.b.dtype();

  // Operand dtypes: both FP8 (not e5m2 × e5m2, which cuBLASLt does not offer; both
  // per-tensor or both block-scaled) or both one plain dtype.
  QMESH_CHECK(args.a.is_block_scaled() == args.b.is_block_scaled(),
              "block-scaled FP8 operands pair only with block-scaled FP8 operands, got GemmArgs.a ",
              operand_kind(args.a), " and .b ", operand_kind(args.b),
              ": quantize both with block scaling (GemmOperand::fp8_block)");
  if (is_fp8(ta) || is_fp8(tb)) {
    QMESH_CHECK(is_fp8_operand(args.a) && is_fp8_operand(args.b),
                "GemmArgs.a and .b must both be FP8 quantized tensors or both plain tensors, got ",
                dtype_name(ta), " and ", dtype_name(tb));
    QMESH_CHECK_KIND(ErrorKind::kUnsupported,
                     !(ta == DType::kFloat8E5M2 && tb == DType::kFloat8E5M2),
                     "FP8 GEMM inputs fp8e5m2 × fp8e5m2 are not supported: use e4m3 × e4m3, "
                     "e4m3 × e5m2 or e5m2 × e4m3");
  } else {
    QMESH_CHECK(is_plain_gemm_dtype(ta) && ta == tb,
                "GemmArgs.a and .b must have the same dtype, one of fp32, bf16, fp16 (or both be "
                "FP8), got ",
                dtype_name(ta), " and ", dtype_name(tb));
  }

  // Devices: everything on D's device.
  check_device(args.a.stored(), c.device, "GemmArgs.a (it must live on D's device)");
  check_device(args.b.stored(), c.device, "GemmArgs.b (it must live on D's device)");
  check_same_device(args.bias, c.device, "GemmArgs.bias (it must live on D's device)");
  check_same_device(args.aux, c.device, "GemmArgs.aux (it must live on D's device)");

  // Shapes: op(A) [M, K], op(B) [K, N], D [M, N].
  const TensorView& sa = args.a.stored();
  const TensorView& sb = args.b.stored();
  const bool a_k_contiguous = args.trans_a == GemmTranspose::kNo;
  const bool b_k_contiguous = args.trans_b == GemmTranspose::kYes;
  const auto [a_rows, a_cols] = element_dims(sa, c.batch, "a");
  const auto [b_rows, b_cols] = element_dims(sb, c.batch, "b");
  const auto [d_rows, d_cols] = element_dims(args.d, c.batch, "d");
  c.m = a_k_contiguous ? a_rows : a_cols;
  c.k = a_k_contiguous ? a_cols : a_rows;
  c.n = b_k_contiguous ? b_rows : b_cols;
  const int64_t kb = b_k_contiguous ? b_cols : b_rows;
  QMESH_CHECK(c.k == kb, "GEMM inner dimensions differ: op(A) is [", c.m, ", ", c.k, "] (A shape ",
              sa.shape.str(), ", trans_a = ", transpose_name(args.trans_a), ") but op(B) is [", kb,
              ", ", c.n, "] (B shape ", sb.shape.str(),
              ", trans_b = ", transpose_name(args.trans_b), ")");
  QMESH_CHECK(d_rows == c.m && d_cols == c.n, "GemmArgs.d must be ", c.batch > 1 ? "[batch, " : "[",
              c.m, ", ", c.n, "] (op(A) rows × op(B) columns), got ", args.d.shape.str());

  // Output.
  c.d = args.d.data;
  c.d_dtype = args.d.dtype;
  c.alpha = args.alpha;
  c.beta = args.output == GemmOutputMode::kAccumulate ? 1.0f : 0.0f;
  if (is_fp8(c.d_dtype)) {
    QMESH_CHECK(is_fp8(ta), "an FP8 output D needs FP8 inputs, got A and B of dtype ",
                dtype_name(ta));
    QMESH_CHECK(args.d_scale != nullptr,
                "GemmArgs.d_scale must point to D's scale (fp32) when D is FP8 (",
                dtype_name(c.d_dtype), ")");
    QMESH_CHECK(args.output == GemmOutputMode::kWrite,
                "GemmOutputMode::kAccumulate is not available with an FP8 output D: accumulate "
                "into an fp32/bf16/fp16 D");
  } else {
    QMESH_CHECK(is_plain_gemm_dtype(c.d_dtype), "GemmArgs.d must be fp32, bf16, fp16 or FP8, got ",
                dtype_name(c.d_dtype));
    QMESH_CHECK(args.d_scale == nullptr && args.d_amax == nullptr,
                "GemmArgs.d_scale and .d_amax are for an FP8 D only; D is ", dtype_name(c.d_dtype),
                ": leave them nullptr");
  }
  c.d_scale = args.d_scale;
  c.d_amax = args.d_amax;

  // Epilogue tensors: exactly those the epilogue uses.
  c.epilogue = args.epilogue;
  const char* ename = gemm_epilogue_name(args.epilogue);
  const bool uses_bias = args.epilogue == GemmEpilogue::kBias ||
                         args.epilogue == GemmEpilogue::kBiasGeluAux ||
                         args.epilogue == GemmEpilogue::kBiasGrad;
  const bool uses_aux =
      args.epilogue == GemmEpilogue::kBiasGeluAux || args.epilogue == GemmEpilogue::kDGelu;
  if (uses_bias) {
    check_epilogue_vector(args.bias, args.epilogue == GemmEpilogue::kBiasGrad ? c.m : c.n, "bias",
                          ename);
    c.bias = args.bias.data;
    c.bias_dtype = args.bias.dtype;
  } else {
    QMESH_CHECK(args.bias.empty(), "GemmArgs.bias is set but epilogue ", ename,
                " does not use it: leave it empty or choose a bias epilogue");
  }
  if (uses_aux) {
    QMESH_CHECK(!args.aux.empty(), "GemmArgs.aux must be set for epilogue ", ename);
    QMESH_CHECK(is_plain_gemm_dtype(args.aux.dtype),
                "GemmArgs.aux must be fp32, bf16 or fp16, got ", dtype_name(args.aux.dtype));
    QMESH_CHECK(args.aux.shape.rows() == c.m && args.aux.shape.cols() == c.n, "GemmArgs.aux of ",
                "epilogue ", ename, " must be [", c.m, ", ", c.n, "] like D, got ",
                args.aux.shape.str());
    c.aux = args.aux.data;
    c.aux_dtype = args.aux.dtype;
  } else {
    QMESH_CHECK(args.aux.empty(), "GemmArgs.aux is set but epilogue ", ename,
                " does not use it: leave it empty");
  }
  c.accumulation = args.accumulation;

  // Copies: the host reads any layout of a plain or per-tensor FP8 operand; cuBLASLt's FP8
  // GEMM, and a block-scaled GEMM on every backend, need both operands K-contiguous.
  const bool need_tn =
      (c.backend == GemmBackend::kCublasLt && is_fp8(ta)) || args.a.is_block_scaled();
  c.a = choose_copy(args.a, a_k_contiguous, need_tn, "a", "trans_a", args.trans_a, c.batch);
  c.b = choose_copy(args.b, b_k_contiguous, need_tn, "b", "trans_b", args.trans_b, c.batch);

  c.cm.m = c.n;
  c.cm.n = c.m;
  c.cm.k = c.k;
  c.cm.trans_a = c.b.k_contiguous;
  c.cm.trans_b = !c.a.k_contiguous;
  c.cm.lda = c.b.cols;
  c.cm.ldb = c.a.cols;
  c.cm.ldd = c.n;
  if (c.batch > 1) {
    c.cm.batch = c.batch;
    c.cm.stride_a = c.b.rows * c.b.cols;
    c.cm.stride_b = c.a.rows * c.a.cols;
    c.cm.stride_d = c.m * c.n;
  }

  if (c.backend == GemmBackend::kCublasLt) {
    if (is_fp8(ta)) check_cublaslt_fp8(c);
    if (c.block_scaled()) check_cublaslt_block(c);
    check_cublaslt_epilogue_dtypes(c);
    check_cublaslt_aux(c);
    QMESH_CHECK_KIND(ErrorKind::kUnsupported, QMESH_WITH_CUDA, "GEMM tensors live on ",
                     c.device.str(), " but qmesh was built with QMESH_WITH_CUDA=OFF");
    require_device(c.device);
  }
  return c;
}

}  // namespace qmesh::detail
