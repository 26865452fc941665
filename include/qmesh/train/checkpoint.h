// Checkpoints of a training run (train_mlp, c_trainer, the C API): per rank, one tensor file
// <dir>/step-<N>/rank-<r>.tensors (qmesh/tensor_file.h) with the model's parameters, the
// optimizer state, the run's configuration, the layer context's recipe ("context.recipe"),
// under NVFP4 its step count ("context.steps") and, under FP8 delayed scaling, its scaling state
// (the "scaling.*" tensors of qmesh/scaling/checkpoint.h); <dir>/latest names the newest complete
// one. Every file is written atomically (a temporary file, fsync'ed, renamed over the file, the
// directory fsync'ed) and only after all ranks finished the previous checkpoint, so a crash never
// leaves `latest` pointing at a partial checkpoint. Loading is collective: every rank reads and
// checks its files whole (checksum included), the ranks agree, and only when every rank succeeded
// does any rank write its tensors; otherwise every rank throws the same Error.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/layers/parameter.h"
#include "qmesh/tensor_file.h"
#include "qmesh/train/optimizer.h"

namespace qmesh {

// The tensor that records the LayerContext's recipe (int32 [1], the Recipe value); a name
// the content's own tensors may not use, as they may not start with "scaling.".
inline constexpr std::string_view kRecipeTensorName = "context.recipe";
// The tensor that records, under NVFP4, the LayerContext's step count (int32 [1]), from which
// the recipe's stochastic rounding and RHT seeds are drawn; load_checkpoint restores it.
inline constexpr std::string_view kStepsTensorName = "context.steps";

// The mesh of a run: world rank = (dp coordinate x fsdp + fsdp coordinate) x tp + tp
// coordinate.
struct MeshLayout {
  int dp = 1, fsdp = 1, tp = 1;
  bool operator==(const MeshLayout&) const = default;
};

struct CheckpointContent {
  std::vector<NamedTensor> tensors;  // parameters, optimizer state, configuration
  // The layers' context: its recipe is saved and checked at load (a checkpoint of another
  // recipe is an Error), and under delayed scaling its FP8 scaling state is saved and loaded
  // (a checkpoint without one is an Error). Null: neither; then a checkpoint that holds them
  // is an Error at load. training_checkpoint sets it.
  LayerContext* context = nullptr;
  // The run's layout, recorded in <dir>/step-<N>/layout.tensors (tensor "layout", int32 [3]:
  // dp, fsdp, tp; the text file <dir>/step-<N>/layout of older checkpoints is read too).
  // Without one nothing is recorded and every rank loads its own files as they are.
  std::optional<MeshLayout> layout;
  // The fsdp-sharded tensors (parameters and their optimizer slots, each this rank's flat,
  // padded shard) and their unsharded element counts; empty without fsdp. A checkpoint
  // written by another dp x fsdp split of the same tp, with or without fsdp, is resharded at
  // load: the tensors an fsdp checkpoint holds as shards are assembled whole (without fsdp
  // here) or cut into this layout's shards, and those of a checkpoint without fsdp are cut.
  std::map<std::string, int64_t> sharded;
};

// The complete content of a training checkpoint, in one call: `context` (its recipe and, under
// delayed scaling, its FP8 scaling state), every parameter's value (fsdp shards marked for
// resharding), the optimizer's state (over the same parameters), the layout of the context's
// mesh when its axes are among "dp", "fsdp", "tp" in that order (else none), and `extra`:
// the caller's own tensors (its configuration, say). The tensors are referenced, not copied:
// everything given must outlive the content.
QMESH_API CheckpointContent training_checkpoint(LayerContext& context,
                                                const std::vector<Parameter*>& params,
                                                Optimizer& optimizer,
                                                std::vector<NamedTensor> extra = {});

// Collective over `world`: every rank writes its files, then rank 0 updates `latest`. When a
// rank cannot write, every rank throws the same Error naming it, and the previous checkpoint
// stays the latest. Blocking; device tensors must be complete (synchronize their stream
// first).
QMESH_API void save_checkpoint(const std::string& dir, int step, const CheckpointContent& content,
                               Communicator& world);

// Collective over `world` (every rank of the run that saved, a communicator of host
// buffers: MPI, UCX or local): loads checkpoint `step` of `dir`, or the one <dir>/latest names
// when `step` is empty, into `content`, and returns its step. The fsdp-sharded tensors are
// resharded when the checkpoint's dp x fsdp split differs from `content.layout` (a different
// tp is an Error that names both layouts). Every rank reads and checks its part first; the
// ranks then agree, and either all of them load, or none changes anything and every rank
// throws the same Error, naming the first failing rank and what is wrong there (no
// checkpoint, a missing or corrupted file, tensors of another model or configuration, a
// different recipe, a missing FP8 state). Blocking.
QMESH_API int load_checkpoint(const std::string& dir, const CheckpointContent& content,
                              Communicator& world, std::optional<int> step = std::nullopt);

}  // namespace qmesh
