// Saving and restoring the delayed-scaling state (amax histories, scales, scale_invs), so that
// a resumed run computes bit-identical scales. The state is a set of named tensors of the
// tensor-file format (qmesh/tensor_file.h), so one checkpoint file can hold it next to the
// weights and optimizer state (train checkpoints do; docs/design/fp8_scaling.md):
//   scaling.amax_history  fp32  [L, n]  the history, operand i in column i, row 0 current
//   scaling.scale         fp32  [n]     the logical values, whatever ScalingStates' storage
//   scaling.scale_inv     fp32  [n]     stride
//   scaling.roles         int32 [n]     each operand's OperandRole
//   scaling.recipe        fp32  [3]     margin, amax_compute_algo, fp8_format (enum values)
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "qmesh/export.h"
#include "qmesh/scaling/scaling_states.h"
#include "qmesh/tensor.h"

namespace qmesh {

// Every name above starts with it; a file's other tensors are not the scaling state's.
inline constexpr std::string_view kScalingTensorPrefix = "scaling.";

// The state's tensors above, as host copies by name (add them to a save_tensors call).
// Blocking. For CUDA states, work that updates them must have completed (synchronize its
// stream first).
QMESH_API std::map<std::string, Tensor> scaling_tensors(const ScalingStates& states);

// Checks that `file` (read_tensors of `path`, which may hold other tensors too) holds a
// scaling state that `states` can take, without modifying anything. Error (naming `path`)
// if its tensors are missing or malformed, or it has a different number of operands,
// history length or operand roles than `states`.
QMESH_API void check_scaling_tensors(const ScalingStates& states,
                                     const std::map<std::string, Tensor>& file,
                                     const std::string& path);

// check_scaling_tensors, then restores `states` from `file`, so on any Error `states` is left
// untouched. A different margin, algorithm or FP8 format only logs a warning (the saved state
// is independent of them). Blocking.
QMESH_API void load_scaling_tensors(ScalingStates& states,
                                    const std::map<std::string, Tensor>& file,
                                    const std::string& path);

// The state alone in a tensor file: save_tensors of scaling_tensors(states) (atomic; Error
// naming the path and the system error if it cannot be written).
QMESH_API void save_scaling_states(const ScalingStates& states, const std::string& path);

// Restores `states` from a tensor file that holds a scaling state (one written by
// save_scaling_states, or a train checkpoint's rank file): read_tensors (every byte checked,
// checksum included) and load_scaling_tensors. Error, with `states` untouched, for a missing,
// unreadable, truncated, corrupted or incompatible file, and for a file of the separate
// scaling-checkpoint format of earlier qmesh versions ("QMSCALE").
QMESH_API void load_scaling_states(ScalingStates& states, const std::string& path);

}  // namespace qmesh
