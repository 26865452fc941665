#include "qmesh/scaling/recipe.h"

#include <cmath>
#include <utility>

#include "qmesh/error.h"

namespace qmesh {

namespace {

constexpr std::pair<Recipe, std::string_view> kRecipeNames[] = {
    {Recipe::kFp32, "fp32"},          {Recipe::kBf16, "bf16"},
    {Recipe::kFp8Delayed, "delayed"}, {Recipe::kFp8Current, "current"},
    {Recipe::kFp8Block, "block"},     {Recipe::kMxfp8, "mxfp8"},
    {Recipe::kNvfp4, "nvfp4"},
};

void check_format(Fp8Format format) {
  QMESH_CHECK(format == Fp8Format::kHybrid || format == Fp8Format::kE4M3,
              "fp8_format must be Fp8Format::kHybrid or kE4M3, got value ", int(format));
}

void check_qparams(const QParams& q, const char* field) {
  QMESH_CHECK(std::isfinite(q.amax_epsilon) && q.amax_epsilon >= 0.0f, "Float8BlockScaling.", field,
              ".amax_epsilon must be finite and >= 0, got ", q.amax_epsilon);
}

void check_block_dim(int dim, const char* field) {
  QMESH_CHECK(dim == 1 || dim == 2, "Float8BlockScaling.", field,
              " must be 1 (1x128 blocks) or 2 (128x128 blocks), got ", dim);
}

void check_split_accumulator(const MMParams& mm, const char* field) {
  QMESH_CHECK(mm.use_split_accumulator, "Float8BlockScaling.", field,
              ".use_split_accumulator must be true: the block-scaled GEMM accumulates in fp32 "
              "outside the tensor cores");
}

// The microscaled recipes take no FP8 attention: fp8_dpa and fp8_mha must be false.
void check_no_fp8_attention(bool dpa, bool mha, const char* recipe, const char* format) {
  QMESH_CHECK_KIND(ErrorKind::kUnsupported, !dpa, recipe,
                   ".fp8_dpa must be false: FP8 attention is not supported with ", format,
                   " scaling");
  QMESH_CHECK_KIND(ErrorKind::kUnsupported, !mha, recipe,
                   ".fp8_mha must be false: FP8 attention is not supported with ", format,
                   " scaling");
}

}  // namespace

std::string_view recipe_name(Recipe recipe) {
  for (auto [r, name] : kRecipeNames)
    if (r == recipe) return name;
  QMESH_THROW("unknown recipe value ", static_cast<int>(recipe));
}

Recipe parse_recipe(std::string_view name) {
  for (auto [r, n] : kRecipeNames)
    if (n == name) return r;
  QMESH_THROW("unknown recipe '", name,
              "' (expected one of fp32, bf16, delayed, current, block, mxfp8, nvfp4)");
}

DType fp8_dtype(Fp8Format format, OperandRole role) {
  check_format(format);
  QMESH_CHECK(role == OperandRole::kInput || role == OperandRole::kWeight ||
                  role == OperandRole::kGradOutput,
              "operand role must be kInput, kWeight or kGradOutput, got value ", int(role));
  if (format == Fp8Format::kHybrid && role == OperandRole::kGradOutput) return DType::kFloat8E5M2;
  return DType::kFloat8E4M3;
}

void validate(const DelayedScaling& recipe) {
  QMESH_CHECK(std::isfinite(recipe.margin) && recipe.margin >= 0.0f && recipe.margin <= 64.0f,
              "DelayedScaling.margin must be in [0, 64], got ", recipe.margin);
  QMESH_CHECK(recipe.amax_history_len >= 1 && recipe.amax_history_len <= 65536,
              "DelayedScaling.amax_history_len must be in [1, 65536], got ",
              recipe.amax_history_len);
  QMESH_CHECK(recipe.amax_compute_algo == AmaxComputeAlgo::kMax ||
                  recipe.amax_compute_algo == AmaxComputeAlgo::kMostRecent,
              "DelayedScaling.amax_compute_algo must be kMax or kMostRecent, got value ",
              int(recipe.amax_compute_algo));
  check_format(recipe.fp8_format);
}

void validate(const Float8CurrentScaling& recipe) {
  check_format(recipe.fp8_format);
  QMESH_CHECK(std::isfinite(recipe.amax_epsilon) && recipe.amax_epsilon >= 0.0f,
              "Float8CurrentScaling.amax_epsilon must be finite and >= 0, got ",
              recipe.amax_epsilon);
}

void validate(const Float8BlockScaling& recipe) {
  QMESH_CHECK(recipe.fp8_format == Fp8Format::kHybrid || recipe.fp8_format == Fp8Format::kE4M3,
              "Float8BlockScaling.fp8_format must be Fp8Format::kE4M3 or kHybrid, got value ",
              int(recipe.fp8_format));
  check_qparams(recipe.fp8_quant_fwd_inp, "fp8_quant_fwd_inp");
  check_qparams(recipe.fp8_quant_fwd_weight, "fp8_quant_fwd_weight");
  check_qparams(recipe.fp8_quant_bwd_grad, "fp8_quant_bwd_grad");
  check_block_dim(recipe.x_block_scaling_dim, "x_block_scaling_dim");
  check_block_dim(recipe.w_block_scaling_dim, "w_block_scaling_dim");
  check_block_dim(recipe.grad_block_scaling_dim, "grad_block_scaling_dim");
  const int two_d = (recipe.x_block_scaling_dim == 2) + (recipe.w_block_scaling_dim == 2) +
                    (recipe.grad_block_scaling_dim == 2);
  QMESH_CHECK(two_d <= 1,
              "Float8BlockScaling: at most one of x_block_scaling_dim, w_block_scaling_dim and "
              "grad_block_scaling_dim may be 2 (a GEMM of two 128x128-block operands is not "
              "supported), got ",
              recipe.x_block_scaling_dim, ", ", recipe.w_block_scaling_dim, ", ",
              recipe.grad_block_scaling_dim);
  check_split_accumulator(recipe.fp8_gemm_fprop, "fp8_gemm_fprop");
  check_split_accumulator(recipe.fp8_gemm_dgrad, "fp8_gemm_dgrad");
  check_split_accumulator(recipe.fp8_gemm_wgrad, "fp8_gemm_wgrad");
  QMESH_CHECK(!recipe.fp8_dpa,
              "Float8BlockScaling.fp8_dpa must be false: FP8 attention is not "
              "supported with block scaling");
  QMESH_CHECK(!recipe.fp8_mha,
              "Float8BlockScaling.fp8_mha must be false: FP8 attention is not "
              "supported with block scaling");
}

void validate(const MXFP8BlockScaling& recipe) {
  QMESH_CHECK(recipe.fp8_format == Fp8Format::kE4M3 || recipe.fp8_format == Fp8Format::kHybrid,
              "MXFP8BlockScaling.fp8_format must be Fp8Format::kE4M3 or kHybrid, got value ",
              int(recipe.fp8_format));
  QMESH_CHECK(std::isfinite(recipe.margin) && recipe.margin >= 0.0f,
              "MXFP8BlockScaling.margin must be finite and >= 0, got ", recipe.margin);
  check_no_fp8_attention(recipe.fp8_dpa, recipe.fp8_mha, "MXFP8BlockScaling", "MXFP8");
}

void validate(const NVFP4BlockScaling& recipe) {
  QMESH_CHECK_KIND(ErrorKind::kUnsupported, recipe.fp4_format == Fp4Format::kE2M1,
                   "NVFP4BlockScaling.fp4_format must be Fp4Format::kE2M1 (the only NVFP4 "
                   "element format), got value ",
                   int(recipe.fp4_format));
  QMESH_CHECK_KIND(ErrorKind::kUnsupported, recipe.fp8_format == Fp8Format::kE4M3,
                   "NVFP4BlockScaling.fp8_format must be Fp8Format::kE4M3 (the format of the "
                   "block scales), got value ",
                   int(recipe.fp8_format));
  check_no_fp8_attention(recipe.fp8_dpa, recipe.fp8_mha, "NVFP4BlockScaling", "NVFP4");
}

}  // namespace qmesh
