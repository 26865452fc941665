// FP8 scaling recipes: plain structs that say how scales are chosen (docs/design/fp8_scaling.md).
#pragma once

#include <cstdint>
#include <string_view>

#include "qmesh/dtype.h"
#include "qmesh/export.h"

namespace qmesh {

// Which precision a model's GEMMs run in (LayerContext's recipe); the structs below configure
// the two FP8 ones.
enum class Recipe {
  kFp32,        // fp32 GEMM operands (the reference in tests)
  kBf16,        // operands rounded to bf16, fp32 accumulation: the high-precision baseline
  kFp8Delayed,  // FP8 operands, delayed scaling (scales from the amax history)
  kFp8Current,  // FP8 operands, current scaling (each tensor scaled by its own amax)
};

// "fp32", "bf16", "delayed", "current" (the training example's --recipe values).
QMESH_API std::string_view recipe_name(Recipe recipe);
// Inverse of recipe_name; Error listing the accepted names.
QMESH_API Recipe parse_recipe(std::string_view name);

// Which FP8 formats a recipe uses.
enum class Fp8Format : uint8_t {
  kHybrid = 0,  // E4M3 for forward operands (inputs, weights), E5M2 for gradients
  kE4M3 = 1,    // E4M3 everywhere
};

// How delayed scaling turns the amax history into the amax that sets the scale.
enum class AmaxComputeAlgo : uint8_t {
  kMax = 0,         // the largest amax in the history window
  kMostRecent = 1,  // the amax of the latest step
};

// What a quantized GEMM operand is: fixes its FP8 format under Fp8Format::kHybrid.
enum class OperandRole : uint8_t {
  kInput = 0,       // forward activation (GEMM input)
  kWeight = 1,      // forward weight
  kGradOutput = 2,  // backward: gradient of the GEMM output
};

// Delayed scaling (TransformerEngine's DelayedScaling; same defaults): the scale used at step t
// comes from the amaxes recorded up to step t-1.
struct DelayedScaling {
  float margin = 0.0f;  // scale = (fp8_max * 2^-margin) / amax
  int amax_history_len = 1024;
  AmaxComputeAlgo amax_compute_algo = AmaxComputeAlgo::kMax;
  Fp8Format fp8_format = Fp8Format::kHybrid;
};

// Current (just-in-time) scaling: each tensor is scaled by its own amax, measured right before
// it is quantized (two passes over the tensor).
struct Float8CurrentScaling {
  Fp8Format fp8_format = Fp8Format::kHybrid;
  // Round every scale down to a power of two (exact scale_inv, no mantissa bits in the scale).
  bool power_of_two_scales = false;
  // amax values below this are raised to it before the scale is computed (0: none).
  float amax_epsilon = 0.0f;
};

// The FP8 dtype of an operand of `role` under `format` (E4M3 or E5M2).
QMESH_API DType fp8_dtype(Fp8Format format, OperandRole role);

// Throws qmesh::Error naming the field unless margin is finite and >= 0, the history length is
// in [1, 65536] and the enums hold known values.
QMESH_API void validate(const DelayedScaling& recipe);
QMESH_API void validate(const Float8CurrentScaling& recipe);

}  // namespace qmesh
