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
  kFp8Block,    // FP8 operands, block scaling (a scale per 1x128 block or 128x128 tile)
  kMxfp8,       // MXFP8 operands (an E8M0 power-of-two scale per 32 elements along K)
  kNvfp4,       // NVFP4 operands (E2M1 codes, an E4M3 scale per 16 elements, an fp32 tensor scale)
};

// "fp32", "bf16", "delayed", "current", "block", "mxfp8", "nvfp4" (the training example's
// --recipe values).
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

// Which FP4 element format a recipe uses (NVFP4: E2M1 only, as in TransformerEngine).
enum class Fp4Format : uint8_t {
  kE2M1 = 0,
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

// How one operand's block scales are chosen (TransformerEngine's QParams): each block's scale
// is current_scale() of the block's amax with these two settings.
struct QParams {
  bool power_2_scale = true;  // round every block scale down to a power of two
  float amax_epsilon = 0.0f;  // block amaxes below this are raised to it (0: none)
};

// Settings of one GEMM of the block-scaled recipe (TransformerEngine's MMParams).
struct MMParams {
  // Accumulate partial products in fp32 outside the tensor cores' accumulator, as the
  // block-scaled GEMM requires (must stay true).
  bool use_split_accumulator = true;
};

// Block scaling (TransformerEngine's Float8BlockScaling, DeepSeek-V3 style; same field names
// and defaults; docs/design/block_scaling.md): every 1x128 slice (block dim 1) or 128x128 tile
// (block dim 2) of an operand has its own current-scaling scale.
struct Float8BlockScaling {
  Fp8Format fp8_format = Fp8Format::kE4M3;
  QParams fp8_quant_fwd_inp;       // forward input (activations)
  QParams fp8_quant_fwd_weight;    // forward weight
  QParams fp8_quant_bwd_grad;      // backward output gradient
  int x_block_scaling_dim = 1;     // inputs: 1x128 blocks (1) or 128x128 (2)
  int w_block_scaling_dim = 2;     // weights
  int grad_block_scaling_dim = 1;  // gradients
  MMParams fp8_gemm_fprop;
  MMParams fp8_gemm_dgrad;
  MMParams fp8_gemm_wgrad;
  bool fp8_dpa = false;  // FP8 attention: not supported with block scaling (must be false)
  bool fp8_mha = false;  // FP8 multi-head attention: likewise
};

// MXFP8 block scaling (TransformerEngine's MXFP8BlockScaling; same field names and defaults;
// docs/design/mxfp8.md): every 32 consecutive elements along a GEMM's K share one E8M0
// power-of-two scale, rounded up from the block's amax so that no element saturates.
struct MXFP8BlockScaling {
  Fp8Format fp8_format = Fp8Format::kE4M3;
  float margin = 0.0f;   // blocks are scaled to fp8_max * 2^-margin (finite, >= 0)
  bool fp8_dpa = false;  // FP8 attention: not supported (must be false)
  bool fp8_mha = false;  // FP8 multi-head attention: likewise
  // Run the MXFP8 GEMMs emulated where the device has no native one (qmesh/ops/
  // gemm_emulation.h); false: such a GEMM is an Error there (unless QMESH_BLOCK_EMULATION=1).
  bool emulate = false;
};

// NVFP4 block scaling (TransformerEngine's NVFP4BlockScaling; same field names and defaults;
// docs/design/nvfp4.md "Recipe"): E2M1 elements, an E4M3 scale per 16 elements along K (16x16
// tiles for weights), an fp32 per-tensor scale; stochastic rounding of the gradients and the
// random Hadamard transform of the wgrad operands, each with a switch to turn it off.
struct NVFP4BlockScaling {
  Fp4Format fp4_format = Fp4Format::kE2M1;   // the elements (must be kE2M1)
  Fp8Format fp8_format = Fp8Format::kE4M3;   // the block scales (must be kE4M3)
  bool disable_rht = false;                  // no random Hadamard transform on wgrad operands
  bool disable_stochastic_rounding = false;  // gradients round to nearest even too
  bool disable_2d_quantization = false;      // weights in 1x16 blocks instead of 16x16 tiles
  bool fp8_dpa = false;                      // FP8 attention: not supported (must be false)
  bool fp8_mha = false;                      // FP8 multi-head attention: likewise
  // Run the NVFP4 GEMMs emulated where the device has no native one (qmesh/ops/
  // gemm_emulation.h); false: such a GEMM is an Error there (unless QMESH_BLOCK_EMULATION=1).
  bool emulate = false;
};

// The FP8 dtype of an operand of `role` under `format` (E4M3 or E5M2).
QMESH_API DType fp8_dtype(Fp8Format format, OperandRole role);

// Throws qmesh::Error naming the field unless margin is finite and >= 0, the history length is
// in [1, 65536] and the enums hold known values.
QMESH_API void validate(const DelayedScaling& recipe);
QMESH_API void validate(const Float8CurrentScaling& recipe);
// Throws qmesh::Error naming the field unless: fp8_format is known, every amax_epsilon is
// finite and >= 0, every block dim is 1 or 2 and at most one of them is 2 (no GEMM takes
// two 128x128-block operands), every use_split_accumulator is true, fp8_dpa and fp8_mha are
// false (the rules TransformerEngine enforces for this recipe).
QMESH_API void validate(const Float8BlockScaling& recipe);
// Throws qmesh::Error naming the field unless fp8_format is known, margin is finite and >= 0,
// and fp8_dpa and fp8_mha are false.
QMESH_API void validate(const MXFP8BlockScaling& recipe);
// Throws qmesh::Error naming the field unless fp4_format is kE2M1, fp8_format is kE4M3, and
// fp8_dpa and fp8_mha are false.
QMESH_API void validate(const NVFP4BlockScaling& recipe);

}  // namespace qmesh
