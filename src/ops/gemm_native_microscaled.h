// The native GEMM of MXFP8 operands (compute capability 10.0+; docs/design/gemm.md "Native
// microscaled GEMMs"): cuBLASLt's FP8 GEMM with the VEC32_UE8M0 scale mode, TN form only.
// Each operand's copy contiguous along K is read in place; its E8M0 scales are swizzled into
// cuBLASLt's tiled layout (ops/scale_swizzle.h) in a buffer this object owns.
#pragma once

#include "ops/gemm_canonical.h"
#include "qmesh/export.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/tensor.h"

namespace qmesh::detail {

// Checks args for the native GEMM (operand kinds and copies, D's dtype, cuBLASLt's FP8
// rules) and returns its canonical form without allocating: the scale pointers point at the
// codes (never read). For Gemm::can_implement and Gemm::workspace_size.
QMESH_API CanonicalGemm native_microscaled_probe(const GemmArgs& args);

class QMESH_API NativeMicroscaledOperands {
 public:
  // Error as native_microscaled_probe; allocates the swizzled scales on D's device.
  explicit NativeMicroscaledOperands(const GemmArgs& args);
  // The GEMM cuBLASLt runs: A and B the K-contiguous codes, scaled by the swizzled scales.
  const CanonicalGemm& canonical() const { return c_; }
  // Swizzles both operands' scales into the owned buffers (enqueued on `stream`), for a GEMM
  // enqueued after it on the same stream.
  void refresh(Stream stream) const;

 private:
  GemmOperand a_, b_;  // the K-contiguous copies, as rowwise operands
  Tensor a_scales_, b_scales_;
  CanonicalGemm c_;
};

}  // namespace qmesh::detail
