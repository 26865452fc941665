// What every layer of a model shares: the mesh, the precision recipe, the placement (device
// and stream), and (for FP8 delayed scaling) the one ScalingStates object that holds every
// quantized operand's state.
//
// Lifecycle: construct the context, construct the layers (each registers its FP8 operands
// with add_operand), then train; call end_step() once per step after backward, on every
// rank: it performs the step's single amax all-reduce over mesh().amax_group() and the
// fused scale update. A layer whose forward runs again after its backward without end_step()
// in between throws.
#pragma once

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "qmesh/comm/mesh.h"
#include "qmesh/export.h"
#include "qmesh/layers/fsdp.h"
#include "qmesh/layers/placement.h"
#include "qmesh/overlap/collective_gemm.h"
#include "qmesh/scaling/recipe.h"
#include "qmesh/scaling/scaling_states.h"

namespace qmesh {

class Dense;         // qmesh/layers/dense.h
class FsdpLayer;     // internal (src/layers/fsdp_layer.h)
class GatherBuffer;  // internal (src/layers/gather_buffer.h)
class Fp8Stats;      // qmesh/layers/fp8_stats.h
class FsdpPrefetch;  // internal (src/layers/fsdp_prefetch.h)

// Everything a LayerContext is configured with besides its mesh and recipe, fixed at
// construction (each layer reads it once, when it is built).
struct LayerContextOptions {
  DelayedScaling delayed{};          // the delayed-scaling recipe (used under kFp8Delayed)
  Float8CurrentScaling current{};    // the current-scaling recipe (used under kFp8Current)
  Float8BlockScaling block{};        // the block-scaling recipe (used under kFp8Block)
  MXFP8BlockScaling mxfp8{};         // the MXFP8 recipe (used under kMxfp8)
  NVFP4BlockScaling nvfp4{};         // the NVFP4 recipe (used under kNvfp4)
  Placement placement{};             // where the layers run: device and streams
  Overlap overlap = Overlap::kNone;  // the collective-GEMM schedule of sequence-parallel
                                     // dense layers whose DenseOptions::overlap is unset
  FsdpOptions fsdp{};                // fully sharded data parallelism (prefetch >= 0)
  Fp8Stats* fp8_stats = nullptr;     // collector of FP8 precision statistics (null: none;
                                     // not owned, it must outlive the layers)
  // The dtype of the activations that blocks keep between their GEMMs (LayerNormMLP's
  // pre-activation and hidden gradient): fp32 or bf16 (not under kFp32, whose GEMMs write
  // fp32). Unset: bf16 under the BF16 and FP8 recipes, fp32 under kFp32 (the reference).
  std::optional<DType> activation_dtype = std::nullopt;
};

class QMESH_API LayerContext {
 public:
  // The context keeps its own copy of `mesh` (a Mesh shares its communicators), so a
  // temporary mesh is fine. The context must outlive its layers, which refer to it; it is
  // neither copied nor moved. The options are validated (Error naming the field; the recipes'
  // fields, a negative fsdp prefetch, an unusable device); only the recipe that `recipe`
  // selects is used. kFp8Block, kMxfp8 and kNvfp4 refuse what they do not support (Error):
  // fp8_stats; kMxfp8 and kNvfp4 also refuse sequence-parallel layers (the collective GEMMs
  // take no MXFP8 or NVFP4 operands).
  // `options.placement`: where the layers built on this context run. On CUDA the mesh's
  // communicators must carry CUDA buffers of that device (NCCL, or the local backend) and every
  // layer call is asynchronous on placement.stream; on the host everything is blocking.
  LayerContext(const Mesh& mesh, Recipe recipe, LayerContextOptions options = {});
  ~LayerContext();
  LayerContext(const LayerContext&) = delete;
  LayerContext& operator=(const LayerContext&) = delete;

  const Mesh& mesh() const { return mesh_; }
  const LayerContextOptions& options() const { return options_; }
  const Placement& placement() const { return options_.placement; }
  Device device() const { return options_.placement.device; }
  Stream stream() const { return options_.placement.stream; }
  Recipe recipe() const { return recipe_; }
  bool is_fp8() const {
    return recipe_ == Recipe::kFp8Delayed || recipe_ == Recipe::kFp8Current ||
           recipe_ == Recipe::kFp8Block || recipe_ == Recipe::kMxfp8 || recipe_ == Recipe::kNvfp4;
  }
  const Float8CurrentScaling& current_scaling() const { return options_.current; }
  const Float8BlockScaling& block_scaling() const { return options_.block; }
  const MXFP8BlockScaling& mxfp8_scaling() const { return options_.mxfp8; }
  const NVFP4BlockScaling& nvfp4_scaling() const { return options_.nvfp4; }
  // The recipe asks for emulated GEMMs of microscaled operands (MXFP8 or NVFP4 `emulate`).
  bool emulate_microscaled() const {
    return recipe_ == Recipe::kNvfp4 ? options_.nvfp4.emulate : options_.mxfp8.emulate;
  }
  const DelayedScaling& delayed_scaling() const { return options_.delayed; }
  // LayerContextOptions::activation_dtype, or the recipe's default when unset.
  DType activation_dtype() const;
  // FP8 dtype of an operand of this role under the active recipe's format.
  DType fp8_dtype(OperandRole role) const;
  // The default collective-GEMM schedule (docs/design/overlap.md).
  Overlap overlap() const { return options_.overlap; }
  Fp8Stats* fp8_stats() const { return options_.fp8_stats; }
  // Fully sharded data parallelism over the mesh's fsdp role (qmesh/layers/fsdp.h): the
  // layers built on this context shard their parameters when fsdp().enabled().
  const FsdpGroup& fsdp() const { return fsdp_; }
  const FsdpOptions& fsdp_options() const { return options_.fsdp; }

  // Registers one quantized operand and returns its index in the scaling states. Only
  // before the first scaling() call (Error afterwards: the states are already laid out).
  int add_operand(OperandRole role);
  // The delayed-scaling states of all registered operands, created on first use on
  // device().
  ScalingStates& scaling();

  // Once per training step, after backward, on every rank of the mesh. Delayed scaling:
  // one all-reduce(MAX) of every operand's current amax over mesh().amax_group(), then
  // the fused update, both ordered on stream(). Other recipes (block scaling included: its
  // scales come from each block alone, no amax crosses ranks): nothing. Under FSDP it first
  // completes the layers' gradient reduce-scatters (the sharded grads are final after it).
  // Counts the steps (NVFP4 draws its stochastic-rounding and RHT seeds from the count).
  void end_step();
  // The number of end_step() calls so far (or the count set_steps restored).
  int64_t steps() const { return steps_; }
  // Restores the step count of a resumed run (load_checkpoint does, under NVFP4), so that the
  // seeds drawn from it are the uninterrupted run's. Error when negative.
  void set_steps(int64_t steps);

 private:
  // The library's layers reach the internals below.
  friend class Dense;
  friend class FsdpLayer;

  // Where layers with GatheredInput::kRegather gather their input in forward and again in
  // backward: one buffer for all of them, so that the gathered [T, in] operand is not kept
  // per layer between forward and backward.
  GatherBuffer& shared_gather_buffer();
  // The gather order of this context's FSDP layers.
  FsdpPrefetch& fsdp_prefetch();
  // The step-sequence check each layer runs at the start of its forward: `last_backward` is
  // steps() when the layer's backward last ran (-1: never). When end_step() has work (delayed
  // scaling, FSDP), a forward after the layer's backward in the same step is an Error naming
  // the missing LayerContext::end_step() (without it the scales would stay frozen, or the
  // FSDP gradients incomplete, and training would go on silently worse).
  void check_forward(int64_t last_backward, std::string_view layer) const;

  const Mesh mesh_;
  Recipe recipe_;
  LayerContextOptions options_;
  FsdpGroup fsdp_;
  std::vector<OperandRole> roles_;
  std::unique_ptr<ScalingStates> states_;
  std::unique_ptr<GatherBuffer> shared_gather_;
  std::unique_ptr<FsdpPrefetch> fsdp_prefetch_;
  int64_t steps_ = 0;
};

}  // namespace qmesh
