#include "ops/gemm_native_microscaled.h"

#include <mutex>

#include "ops/gemm_emulation.h"
#include "ops/scale_swizzle.h"
#include "qmesh/logging.h"

namespace qmesh::detail {

namespace {

std::once_flag g_logged;

// The swizzled scales' shape of a K-contiguous copy.
Shape swizzled_shape(const GemmOperand& copy) {
  return swizzled_scale_shape(copy.mx.scale.shape.rows(), copy.mx.scale.shape.cols());
}

// The copy as a per-tensor FP8 operand whose scalar pointers all hold `scales`: the form that
// canonicalize checks with cuBLASLt's FP8 rules, before the scale mode is set.
GemmOperand fp8_form(const GemmOperand& copy, const void* scales) {
  QuantizedTensorView q;
  q.data = copy.mx.data;
  q.scale = q.scale_inv = q.amax = static_cast<float*>(const_cast<void*>(scales));
  return GemmOperand::fp8(q);
}

CanonicalGemm native_form(const GemmArgs& args, const MicroscaledCopies& copies,
                          const void* a_scales, const void* b_scales) {
  GemmArgs fp8 = args;
  fp8.a = fp8_form(copies.a, a_scales);
  fp8.b = fp8_form(copies.b, b_scales);
  fp8.trans_a = GemmTranspose::kNo;
  fp8.trans_b = GemmTranspose::kYes;
  CanonicalGemm c = canonicalize(fp8);
  c.a.scaling = GemmScaling::kVec32Ue8m0;
  c.b.scaling = GemmScaling::kVec32Ue8m0;
  return c;
}

}  // namespace

CanonicalGemm native_microscaled_probe(const GemmArgs& args) {
  const MicroscaledCopies c = checked_copies(args);
  return native_form(args, c, c.a.mx.data.data, c.b.mx.data.data);
}

NativeMicroscaledOperands::NativeMicroscaledOperands(const GemmArgs& args) {
  const MicroscaledCopies c = checked_copies(args);
  a_ = c.a;
  b_ = c.b;
  a_scales_ = Tensor(DType::kFloat8E8M0, swizzled_shape(a_), args.d.device);
  b_scales_ = Tensor(DType::kFloat8E8M0, swizzled_shape(b_), args.d.device);
  c_ = native_form(args, c, a_scales_.data(), b_scales_.data());
}

void NativeMicroscaledOperands::refresh(Stream stream) const {
  swizzle_block_scales(a_.mx.scale, a_scales_.view(), stream);
  swizzle_block_scales(b_.mx.scale, b_scales_.view(), stream);
  std::call_once(g_logged, [&] {
    QMESH_LOG_INFO("GEMMs with MXFP8 operands run natively on ", c_.device.str(),
                   " (cuBLASLt, VEC32_UE8M0 block scales)");
  });
}

}  // namespace qmesh::detail
