// The delayed-scaling state of every quantized operand of a model, in one owner object.
#pragma once

#include <vector>

#include "qmesh/device.h"
#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/scaling/recipe.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// Storage (all fp32, on one device, each a single contiguous allocation):
//   amax_history  [history_len, n]: row 0 holds the current step's amax of every operand,
//                  so row 0 is the packed buffer that ONE all-reduce(MAX) reduces;
//   scale, scale_inv [n, QuantizedTensor::kScalarSlot]: operand i's value is element 0 of
//                  row i, the rest zero padding, so that every operand's scale and
//                  scale_inv start 16 bytes apart: cuBLASLt takes FP8 scale pointers only
//                  16-byte aligned (docs/design/gemm.md), which bind() hands out as they are.
// Operand i is column i of the history. Initial state: history all zero, scale = scale_inv = 1.
// Not thread-safe; CUDA states are only touched on the streams passed in.
// The fused delayed-scaling update (docs/design/fp8_scaling.md) on state the caller owns, in
// place: amax_history fp32 [L, n] with row 0 the current (already reduced) amaxes, scale
// fp32 [n] or [n, k] (operand i's scale in element 0 of row i, as ScalingStates keeps it),
// fp8_max fp32 [n] (the largest finite value of each operand's FP8 dtype); L must
// be recipe.amax_history_len. For each operand whose current amax is not 0: roll its history,
// zero row 0 and compute a new scale with recipe's margin and algorithm; operands whose amax
// is 0 are left as they are. All on one device. Host: blocking. CUDA: one kernel on `stream`.
QMESH_API void update_delayed_scaling(const TensorView& amax_history, const TensorView& scale,
                                      const TensorView& fp8_max, const DelayedScaling& recipe,
                                      Stream stream = {});

class QMESH_API ScalingStates {
 public:
  ScalingStates() = default;
  // One operand per entry of `roles`; the recipe (validated) fixes history length, margin,
  // algorithm and, with each role, the operand's FP8 dtype.
  ScalingStates(const DelayedScaling& recipe, std::vector<OperandRole> roles,
                Device device = Device::host());

  // Number of operands n.
  int size() const { return static_cast<int>(roles_.size()); }
  // History length L (recipe().amax_history_len).
  int history_len() const { return recipe_.amax_history_len; }
  const DelayedScaling& recipe() const { return recipe_; }
  // Where all the tensors below live.
  Device device() const { return device_; }
  const std::vector<OperandRole>& roles() const { return roles_; }
  // Role and FP8 dtype of operand i (Error if i is out of range).
  OperandRole role(int i) const;
  DType dtype(int i) const;

  // Views of the owned storage (valid while this object lives; on device()):
  // fp32 [L, n], operand i in column i, row 0 = current step.
  TensorView amax_history() const { return history_.view(); }
  // Row 0 of amax_history: fp32 [n], the current amaxes of all operands, contiguous.
  TensorView current_amax() const;
  // fp32 [n, QuantizedTensor::kScalarSlot] each: operand i's value in element 0 of row i.
  TensorView scale() const { return scale_.view(); }
  TensorView scale_inv() const { return scale_inv_.view(); }

  // Points q's scale, scale_inv and amax at operand i, so that quantizing into q records
  // its amax in the history and uses the operand's scale. q.data must have dtype(i).
  void bind(int i, QuantizedTensorView& q) const;

  // The fused update of all operands, per docs/design/fp8_scaling.md (docs/numerics.md "Delayed
  // scaling"): for each operand whose current amax (after the global reduction) is not 0, roll its
  // history and compute a new scale; operands whose amax is 0 are left as they are.
  // scale_inv is not touched here: the next quantize writes it next to the codes it
  // belongs to. Host: one pass, blocking. CUDA: one kernel on `stream`, asynchronous.
  void update(Stream stream = {});

 private:
  DelayedScaling recipe_;
  std::vector<OperandRole> roles_;
  Device device_;
  Tensor history_;
  Tensor scale_;
  Tensor scale_inv_;
  Tensor fp8_max_;  // fp32 [n] on device_: fp8_max(dtype(i)) for the update kernel
};

}  // namespace qmesh
