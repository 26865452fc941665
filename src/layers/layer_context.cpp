#include "qmesh/layers/layer_context.h"

#include "layers/fsdp_prefetch.h"
#include "layers/gather_buffer.h"
#include "qmesh/error.h"
#include "qmesh/scaling/amax_reducer.h"

namespace qmesh {

LayerContext::LayerContext(const Mesh& mesh, Recipe recipe, LayerContextOptions options)
    : mesh_(mesh), recipe_(recipe), options_(options), fsdp_(mesh_) {
  require_device(options_.placement.device);
  (void)recipe_name(recipe);  // rejects an out-of-range value
  validate(options_.delayed);
  validate(options_.current);
  validate(options_.block);
  validate(options_.mxfp8);
  validate(options_.nvfp4);
  if (recipe == Recipe::kFp8Block || recipe == Recipe::kMxfp8 || recipe == Recipe::kNvfp4) {
    QMESH_CHECK_KIND(ErrorKind::kUnsupported, !options_.fp8_stats,
                     "LayerContextOptions::fp8_stats: FP8 statistics are collected for per-tensor "
                     "scaling only; unset it under the '",
                     recipe_name(recipe), "' recipe");
  }
  QMESH_CHECK(options_.fsdp.prefetch >= 0,
              "FsdpOptions::prefetch must be >= 0 (layers gathered ahead), got ",
              options_.fsdp.prefetch);
  QMESH_CHECK(!options_.activation_dtype || *options_.activation_dtype == DType::kFloat32 ||
                  *options_.activation_dtype == DType::kBFloat16,
              "LayerContextOptions::activation_dtype must be fp32 or bf16 (or unset for the "
              "recipe's default), got ",
              dtype_name(options_.activation_dtype.value_or(DType::kFloat32)));
  QMESH_CHECK(recipe != Recipe::kFp32 || activation_dtype() == DType::kFloat32,
              "LayerContextOptions::activation_dtype: the fp32 recipe keeps fp32 activations (its "
              "GEMMs write fp32 only); leave it unset or fp32");
}

DType LayerContext::activation_dtype() const {
  if (options_.activation_dtype) return *options_.activation_dtype;
  return recipe_ == Recipe::kFp32 ? DType::kFloat32 : DType::kBFloat16;
}

LayerContext::~LayerContext() = default;

GatherBuffer& LayerContext::shared_gather_buffer() {
  if (!shared_gather_) shared_gather_ = std::make_unique<GatherBuffer>();
  return *shared_gather_;
}

FsdpPrefetch& LayerContext::fsdp_prefetch() {
  if (!fsdp_prefetch_) fsdp_prefetch_ = std::make_unique<FsdpPrefetch>();
  return *fsdp_prefetch_;
}

DType LayerContext::fp8_dtype(OperandRole role) const {
  switch (recipe_) {
    case Recipe::kFp8Current:
      return qmesh::fp8_dtype(options_.current.fp8_format, role);
    case Recipe::kFp8Block:
      return qmesh::fp8_dtype(options_.block.fp8_format, role);
    case Recipe::kMxfp8:
      return qmesh::fp8_dtype(options_.mxfp8.fp8_format, role);
    default:
      return qmesh::fp8_dtype(options_.delayed.fp8_format, role);
  }
}

int LayerContext::add_operand(OperandRole role) {
  QMESH_CHECK(!states_,
              "an FP8 operand was registered after training started; build every "
              "layer before the first forward");
  roles_.push_back(role);
  return static_cast<int>(roles_.size()) - 1;
}

ScalingStates& LayerContext::scaling() {
  if (!states_) {
    QMESH_CHECK(!roles_.empty(), "no FP8 operands were registered with this context");
    states_ = std::make_unique<ScalingStates>(options_.delayed, roles_, options_.placement.device);
  }
  return *states_;
}

void LayerContext::check_forward(int64_t last_backward, std::string_view layer) const {
  // (NVFP4: end_step advances the step that seeds stochastic rounding and the RHT.)
  const bool end_step_has_work =
      recipe_ == Recipe::kFp8Delayed || recipe_ == Recipe::kNvfp4 || fsdp_.enabled();
  QMESH_CHECK(!end_step_has_work || last_backward != steps_, "layer '", layer,
              "': forward after its backward in step ", steps_,
              " without LayerContext::end_step() (qmesh_context_end_step) in between: call it "
              "once per step, after backward (and GradSync::finish) and before the next "
              "forward; without it ",
              recipe_ == Recipe::kFp8Delayed ? "the FP8 scales stay frozen"
              : recipe_ == Recipe::kNvfp4
                  ? "NVFP4's stochastic rounding repeats the same random bits every step"
                  : "the FSDP gradient reductions stay incomplete");
}

void LayerContext::set_steps(int64_t steps) {
  QMESH_CHECK(steps >= 0, "LayerContext::set_steps: the step count must be >= 0, got ", steps);
  steps_ = steps;
}

void LayerContext::end_step() {
  ++steps_;
  if (fsdp_prefetch_) fsdp_prefetch_->finish_deferred();
  if (recipe_ != Recipe::kFp8Delayed || roles_.empty()) return;
  AmaxReducer(mesh_).reduce_and_update(scaling(), options_.placement.stream);
}

}  // namespace qmesh
