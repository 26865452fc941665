#include "ops/gemm_native_microscaled.h"

#include <mutex>

#include "ops/gemm_device_scalars.h"
#include "ops/gemm_emulation.h"
#include "ops/scale_swizzle.h"
#include "qmesh/error.h"
#include "qmesh/logging.h"

namespace qmesh::detail {

namespace {

std::once_flag g_logged[2];  // MXFP8, NVFP4: the first native GEMM of each is logged

// The block scales of a K-contiguous copy, row-major [rows, K / block].
const TensorView& block_scales(const GemmOperand& copy) {
  return copy.is_nvfp4() ? copy.nv.scale : copy.mx.scale;
}

Shape swizzled_shape(const GemmOperand& copy) {
  const TensorView& s = block_scales(copy);
  return swizzled_scale_shape(s.shape.rows(), s.shape.cols());
}

// The copy as a per-tensor FP8 operand of its [rows, K] elements whose scalar pointers all
// hold `scales`: the form that canonicalize checks with cuBLASLt's FP8 rules, before the
// codes' dtype and the scale mode are set.
GemmOperand fp8_form(const GemmOperand& copy, const void* scales) {
  QuantizedTensorView q;
  if (copy.is_nvfp4())
    q.data = TensorView(copy.nv.data.data, DType::kFloat8E4M3,
                        Shape{copy.nv.rows(), copy.nv.cols()}, copy.device());
  else
    q.data = copy.mx.data;
  q.scale = q.scale_inv = q.amax = static_cast<float*>(const_cast<void*>(scales));
  return GemmOperand::fp8(q);
}

// The native form; `alpha_beta`: NVFP4's device alpha and beta.
CanonicalGemm native_form(const GemmArgs& args, const MicroscaledCopies& copies,
                          const void* a_scales, const void* b_scales, const float* alpha_beta) {
  GemmArgs fp8 = args;
  fp8.a = fp8_form(copies.a, a_scales);
  fp8.b = fp8_form(copies.b, b_scales);
  fp8.trans_a = GemmTranspose::kNo;
  fp8.trans_b = GemmTranspose::kYes;
  CanonicalGemm c = canonicalize(fp8);
  if (!copies.a.is_nvfp4()) {
    c.a.scaling = c.b.scaling = GemmScaling::kVec32Ue8m0;
    return c;
  }
  QMESH_CHECK(c.k % kNativeNvFp4KAlignment == 0, "the native NVFP4 GEMM on ", c.device.str(),
              " needs K to be a multiple of ", kNativeNvFp4KAlignment,
              " (cuBLASLt reads rows of FP4 codes in 16-byte units), got K = ", c.k,
              ": pad K (the contracted dimension) to a multiple of ", kNativeNvFp4KAlignment);
  c.a.dtype = c.b.dtype = DType::kFloat4E2M1x2;
  c.a.scaling = c.b.scaling = GemmScaling::kVec16Ue4m3;
  c.device_alpha_beta = alpha_beta;
  return c;
}

}  // namespace

CanonicalGemm native_microscaled_probe(const GemmArgs& args) {
  const MicroscaledCopies c = checked_copies(args);
  const void* codes = c.a.stored().data;
  return native_form(args, c, codes, c.b.stored().data, static_cast<const float*>(codes));
}

NativeMicroscaledOperands::NativeMicroscaledOperands(const GemmArgs& args) {
  const MicroscaledCopies c = checked_copies(args);
  a_ = c.a;
  b_ = c.b;
  alpha_ = args.alpha;
  const DType scale_dtype = block_scales(a_).dtype;
  a_scales_ = Tensor(scale_dtype, swizzled_shape(a_), args.d.device);
  b_scales_ = Tensor(scale_dtype, swizzled_shape(b_), args.d.device);
  if (a_.is_nvfp4()) alpha_beta_ = Tensor(DType::kFloat32, Shape{2}, args.d.device);
  c_ = native_form(args, c, a_scales_.data(), b_scales_.data(),
                   static_cast<const float*>(alpha_beta_.data()));
}

void NativeMicroscaledOperands::refresh(Stream stream) const {
  swizzle_block_scales(block_scales(a_), a_scales_.view(), stream);
  swizzle_block_scales(block_scales(b_), b_scales_.view(), stream);
  if (a_.is_nvfp4())
    write_gemm_device_scalars(a_.nv.scale_inv, b_.nv.scale_inv, alpha_, c_.beta, alpha_beta_.view(),
                              stream);
  std::call_once(g_logged[a_.is_nvfp4()], [&] {
    QMESH_LOG_INFO("GEMMs with ", a_.is_nvfp4() ? "NVFP4" : "MXFP8", " operands run natively on ",
                   c_.device.str(), " (cuBLASLt, ", a_.is_nvfp4() ? "VEC16_UE4M3" : "VEC32_UE8M0",
                   " block scales)");
  });
}

}  // namespace qmesh::detail
