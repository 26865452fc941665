// The emulated GEMM of microscaled operands (qmesh/ops/gemm_emulation.h): "dequantize each
// operand as its format defines, then a plain GEMM". The format decides only the dequantize
// step (dequantize_operand), so a new microscaled format plugs in there.
#pragma once

#include "qmesh/ops/gemm.h"
#include "qmesh/tensor.h"

namespace qmesh::detail {

bool has_microscaled_operand(const GemmArgs& args);

// The copies of both operands whose rows run along K (where the 1x32 blocks must lie), as
// rowwise operands: what the emulated and the native GEMM read.
struct MicroscaledCopies {
  GemmOperand a, b;
};
// Error unless both operands are microscaled, have the copies the transposes need and live
// on D's device, and D is not FP8.
MicroscaledCopies checked_copies(const GemmArgs& args);

// Checks args for emulation (operand kinds and copies, D's dtype; permission is the caller's,
// ops/microscaled_gemm_path.h): Error if it cannot run emulated. Returns args with the operands
// replaced by plain [M, K] / [N, K] placeholder views of the dequantized dtype (pointing at the
// codes, never read): the form that the plain GEMM's argument checks take.
GemmArgs emulated_probe(const GemmArgs& args);

// The dequantized operands of one emulated GEMM, owned on D's device.
class EmulatedOperands {
 public:
  explicit EmulatedOperands(const GemmArgs& args);
  // args with the operands replaced by the dequantized tensors (canonical TN form).
  const GemmArgs& plain() const { return plain_; }
  // Dequantizes both operands into the owned tensors (on `stream` on CUDA), counts one
  // emulated GEMM and logs the first one of the process.
  void refresh(Stream stream) const;

 private:
  GemmArgs plain_;
  GemmOperand a_, b_;  // the K-contiguous copies, as rowwise operands
  Tensor a_plain_, b_plain_;
};

}  // namespace qmesh::detail
