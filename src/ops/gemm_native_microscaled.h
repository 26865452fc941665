// The native GEMM of microscaled operands (compute capability 10.0+; docs/design/gemm.md
// "Native microscaled GEMMs"), TN form only. MXFP8: cuBLASLt's FP8 GEMM with the VEC32_UE8M0
// scale mode. NVFP4: its FP4 GEMM (CUDA_R_4F_E2M1 codes) with the VEC16_UE4M3 scale mode, the
// two per-tensor fp32 decode scales folded into an alpha on the device
// (ops/gemm_device_scalars.h). Each operand's copy contiguous along K is read in place; its
// block scales are swizzled into cuBLASLt's tiled layout (ops/scale_swizzle.h) in a buffer
// this object owns.
#pragma once

#include "ops/gemm_canonical.h"
#include "qmesh/export.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/tensor.h"

namespace qmesh::detail {

// The native NVFP4 GEMM needs K to be a multiple of this (cuBLASLt reads the rows of FP4
// codes, K / 2 bytes, in 16-byte units).
inline constexpr int64_t kNativeNvFp4KAlignment = 32;

// Checks args for the native GEMM (operand kinds and copies, D's dtype, cuBLASLt's FP8 rules,
// for NVFP4 K a multiple of kNativeNvFp4KAlignment) and returns its canonical form without
// allocating: the scale pointers (and NVFP4's device alpha and beta) point at the codes
// (never read). For Gemm::can_implement and Gemm::workspace_size.
QMESH_API CanonicalGemm native_microscaled_probe(const GemmArgs& args);

class QMESH_API NativeMicroscaledOperands {
 public:
  // Error as native_microscaled_probe; allocates the swizzled scales (and NVFP4's device alpha
  // and beta) on D's device.
  explicit NativeMicroscaledOperands(const GemmArgs& args);
  // The GEMM cuBLASLt runs: A and B the K-contiguous codes, scaled by the swizzled scales;
  // NVFP4: with device_alpha_beta at the owned scalars.
  const CanonicalGemm& canonical() const { return c_; }
  // Swizzles both operands' scales into the owned buffers and, for NVFP4, writes the device
  // alpha (args.alpha times both per-tensor decode scales) and beta (all enqueued on
  // `stream`), for a GEMM enqueued after it on the same stream.
  void refresh(Stream stream) const;

 private:
  GemmOperand a_, b_;  // the K-contiguous copies, as rowwise operands
  Tensor a_scales_, b_scales_;
  Tensor alpha_beta_;  // NVFP4: fp32 [2]
  float alpha_ = 1.0f;
  CanonicalGemm c_;
};

}  // namespace qmesh::detail
