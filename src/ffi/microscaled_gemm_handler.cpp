// XLA FFI handler of the GEMM of microscaled operands (qmesh::gemm with GemmOperand::mxfp8 /
// ::nvfp4): D = A · Bᵀ in fp32, the TN form, each operand given as its copy whose rows run
// along K (the rowwise copy of A [M, K], of B [N, K]). qmesh::gemm picks where it runs: the
// native cuBLASLt GEMM on compute capability 10.0+, the C++ emulation elsewhere when `emulate`
// (or QMESH_BLOCK_EMULATION=1), otherwise its Error naming the device.
//
// Operands: a, a_scale, a_scale_inv, b, b_scale, b_scale_inv. The format is a's dtype:
//   MXFP8  a float8_e4m3fn / float8_e5m2 [M, K], a_scale float8_e8m0fnu [M, K / 32];
//          a_scale_inv is not read (any float32 buffer)
//   NVFP4  a uint8 [M, K / 2] (two float4_e2m1fn codes per byte), a_scale float8_e4m3fn
//          [M, K / 16], a_scale_inv float32 [1] (the per-tensor decode scale)
// and the same for b [N, K]. Result: d float32 [M, N]. Attribute: emulate (bool).
// Not command-buffer compatible: the GEMM allocates its dequantized operands (emulated) or
// swizzled scales (native).
#include <cstdint>

#include "ffi/ffi_support.h"
#include "qmesh/ops/gemm.h"

namespace qmesh::ffi {
namespace {

// One operand, checked and viewed: codes [rows, K] (NVFP4 packed), scales, scale_inv.
GemmOperand microscaled_operand(const Where& w, const AnyBuffer& codes, const AnyBuffer& scale,
                                const AnyBuffer& scale_inv, const char* what) {
  require_rank(codes, 2, what);
  const std::string scale_what = std::string(what) + "_scale";
  const int64_t rows = codes.dimensions()[0];
  if (codes.element_type() == xffi::DataType::U8) {
    NvFp4TensorView nv;
    nv.data = packed_view(codes, w, rows, what);
    nv.scale = view(scale, w, scale_what);
    nv.scale_inv = view(scale_inv, w, std::string(what) + "_scale_inv");
    nv.validate(what);
    return GemmOperand::nvfp4(nv);
  }
  const TensorView data = view(codes, w, what);
  QMESH_CHECK(is_fp8(data.dtype), what,
              " must hold MXFP8 codes (float8_e4m3fn or float8_e5m2) or NVFP4 codes (uint8, two "
              "float4_e2m1fn per byte), not ",
              dtype_name(data.dtype));
  MxFp8TensorView mx;
  mx.data = data;
  mx.scale = view(scale, w, scale_what);
  mx.validate(what);
  return GemmOperand::mxfp8(mx);
}

// a, a_scale, a_scale_inv, b, b_scale, b_scale_inv -> d = A · Bᵀ: qmesh::gemm.
void microscaled_gemm_impl(const Where& w, AnyBuffer a, AnyBuffer a_scale, AnyBuffer a_scale_inv,
                           AnyBuffer b, AnyBuffer b_scale, AnyBuffer b_scale_inv,
                           Result<AnyBuffer> d, bool emulate) {
  GemmArgs args;
  args.a = microscaled_operand(w, a, a_scale, a_scale_inv, "a");
  args.b = microscaled_operand(w, b, b_scale, b_scale_inv, "b");
  args.trans_a = GemmTranspose::kNo;
  args.trans_b = GemmTranspose::kYes;
  require_dtype(*d, {DType::kFloat32}, "d (the GEMM output)");
  require_rank(*d, 2, "d (the GEMM output)");
  args.d = view(d, w, "d (the GEMM output)");
  args.emulate_microscaled = emulate;
  gemm(args, w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshMicroscaledGemm, qmesh::ffi::microscaled_gemm_impl,
                  .Arg<AnyBuffer>()      // a
                      .Arg<AnyBuffer>()  // a_scale
                      .Arg<AnyBuffer>()  // a_scale_inv
                      .Arg<AnyBuffer>()  // b
                      .Arg<AnyBuffer>()  // b_scale
                      .Arg<AnyBuffer>()  // b_scale_inv
                      .Ret<AnyBuffer>()  // d
                      .Attr<bool>("emulate"));
