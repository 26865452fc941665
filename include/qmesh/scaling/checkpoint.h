// Saving and restoring the delayed-scaling state (amax histories, scales, scale_invs), so that
// a resumed run computes bit-identical scales. Format: docs/design/scaling.md.
#pragma once

#include <string>

#include "qmesh/export.h"
#include "qmesh/scaling/scaling_states.h"

namespace qmesh {

// The format version that save_scaling_states writes and load_scaling_states reads.
inline constexpr uint32_t kScalingCheckpointVersion = 1;

// Writes every operand's amax history, scale and scale_inv (plus the recipe and roles) to
// `path`, through a temporary file in the same directory that is fsync'ed and then renamed
// over `path`: a crash leaves either the old file or the complete new one. Blocking. For
// CUDA states, work that updates them must have completed (synchronize its stream first).
// Error (naming the path and the system error) if the file cannot be written.
QMESH_API void save_scaling_states(const ScalingStates& states, const std::string& path);

// Restores `states` from a file written by save_scaling_states. All checks happen before
// anything is copied, so on any Error `states` is left untouched: a missing or unreadable
// file, a wrong magic number, another format version, a truncated or over-long file, a
// checksum mismatch (corruption), or a different number of operands, history length or
// operand roles than `states` has. A different margin, algorithm or format only logs a
// warning (the saved state is independent of them). Blocking.
QMESH_API void load_scaling_states(ScalingStates& states, const std::string& path);

}  // namespace qmesh
