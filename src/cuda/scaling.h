// Launchers of the CUDA kernels behind delayed and current scaling (cuda/scaling.cu); the
// rules they evaluate are scaling/scale_rules.h. Arguments are checked by the callers; each
// launcher makes `device` current, enqueues on `stream` and returns at once.
#pragma once

#include <cstdint>

#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

// The fused delayed-scaling update of all n operands (one kernel on CUDA device `device`,
// ordered on `stream`). history: fp32 [len, n]; fp8_max: fp32 [n]; operand i's scale:
// scale[i * scale_stride].
void update_scales(int device, float* history, float* scale, int64_t scale_stride,
                   const float* fp8_max, int n, int len, bool most_recent, float margin_scale,
                   Stream stream);
// *scale = current_scale_rule(*amax, ...) on CUDA device `device`, ordered on `stream`.
void set_current_scale(int device, const float* amax, float* scale, float fp8_max,
                       bool power_of_two, float epsilon, Stream stream);

}  // namespace qmesh::detail::cuda
