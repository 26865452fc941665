// Checkpoints of a training run (train_mlp, c_trainer, the C API): per rank, one tensor file
// <dir>/step-<N>/rank-<r>.tensors (qmesh/tensor_file.h) with the model's parameters, the
// optimizer state, the run's configuration and, under FP8 delayed scaling, the scaling state
// (the "scaling.*" tensors of qmesh/scaling/checkpoint.h); <dir>/latest names the newest
// complete one. Every load reads a file whole and checks it (checksum included) before
// anything is written. Every file is written atomically and only after all ranks finished
// the previous checkpoint, so a crash never leaves `latest` pointing at a partial checkpoint.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/tensor_file.h"

namespace qmesh {

// The mesh of a run: world rank = (dp coordinate x fsdp + fsdp coordinate) x tp + tp
// coordinate.
struct MeshLayout {
  int dp = 1, fsdp = 1, tp = 1;
  bool operator==(const MeshLayout&) const = default;
};

struct CheckpointContent {
  std::vector<NamedTensor> tensors;  // parameters, optimizer state, configuration
  LayerContext* fp8 = nullptr;       // its scaling states are saved and loaded when delayed
  // The run's layout, recorded in <dir>/step-<N>/layout. Without one (the C API) nothing is
  // recorded and every rank loads its own files as they are.
  std::optional<MeshLayout> layout;
  // The fsdp-sharded tensors (parameters and their optimizer slots, each this rank's flat,
  // padded shard) and their unsharded element counts; empty without fsdp. A checkpoint
  // written by another dp x fsdp split of the same tp, with or without fsdp, is resharded at
  // load: the tensors an fsdp checkpoint holds as shards are assembled whole (without fsdp
  // here) or cut into this layout's shards, and those of a checkpoint without fsdp are cut.
  std::map<std::string, int64_t> sharded;
};

// Collective over `world`: every rank writes its files, then rank 0 updates `latest`.
QMESH_API void save_checkpoint(const std::string& dir, int step, const CheckpointContent& content,
                               Communicator& world);

// Loads the checkpoint `latest` names into `content` and returns its step, resharding the
// fsdp-sharded tensors when the checkpoint's dp x fsdp split differs from `content.layout`
// (a different tp is an Error that names both layouts). Error
// (saying what is wrong and where) if there is none or it does not match this run's
// configuration.
QMESH_API int load_latest_checkpoint(const std::string& dir, const CheckpointContent& content,
                                     int rank);

}  // namespace qmesh
