#include "qmesh/scaling/recipe.h"

#include <cmath>
#include <utility>

#include "qmesh/error.h"

namespace qmesh {

namespace {

constexpr std::pair<Recipe, std::string_view> kRecipeNames[] = {
    {Recipe::kFp32, "fp32"},
    {Recipe::kBf16, "bf16"},
    {Recipe::kFp8Delayed, "delayed"},
    {Recipe::kFp8Current, "current"},
};

void check_format(Fp8Format format) {
  QMESH_CHECK(format == Fp8Format::kHybrid || format == Fp8Format::kE4M3,
              "fp8_format must be Fp8Format::kHybrid or kE4M3, got value ", int(format));
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
  QMESH_THROW("unknown recipe '", name, "' (expected one of fp32, bf16, delayed, current)");
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

}  // namespace qmesh
