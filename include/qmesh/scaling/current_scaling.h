// Current scaling: scale from a tensor's own amax, then quantize with it.
#pragma once

#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/scaling/recipe.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// The current-scaling scale for `amax` and FP8 dtype `fp8` (TransformerEngine's rule):
//   a = max(amax, recipe.amax_epsilon);
//   a == 0, a == +inf or a is NaN  -> 1;
//   otherwise s = fp8_max / a, +inf -> FLT_MAX, and with power_of_two_scales the mantissa
//   bits of s are cleared (s rounded down to a power of two).
QMESH_API float current_scale(float amax, DType fp8, const Float8CurrentScaling& recipe);

// *out.scale = current_scale(*out.amax, out.dtype(), recipe), computed where out lives: for
// an amax measured (and possibly all-reduced) beforehand. Host: blocking. CUDA: one kernel
// on `stream`; amax and scale never leave the device.
QMESH_API void set_current_scale(const QuantizedTensorView& out, const Float8CurrentScaling& recipe,
                                 Stream stream = {});

// Current-scaling quantization of x into out (out's dtype is the FP8 format): measures
// max|x| into *out.amax, sets *out.scale = current_scale(...), then quantizes (and also fills
// out.data_t when out has a columnwise copy, as cast_transpose does). Two passes over x.
// Host: blocking. CUDA: asynchronous on `stream` (the scale never leaves the device).
QMESH_API void quantize_current_scaling(const TensorView& x, const QuantizedTensorView& out,
                                        const Float8CurrentScaling& recipe, Stream stream = {});

}  // namespace qmesh
