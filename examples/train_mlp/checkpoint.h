// Checkpoints of a training run: per rank, the model's parameters, the optimizer state, the
// FP8 scaling state and the run's configuration, in <dir>/step-<N>/; <dir>/latest names the
// newest complete one. Every file is written atomically and written only after all ranks
// finished the previous checkpoint, so a crash never leaves `latest` pointing at a partial
// checkpoint.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/tensor_file.h"

namespace train_mlp {

// The mesh of a run: world rank = (dp coordinate x fsdp + fsdp coordinate) x tp + tp
// coordinate.
struct MeshLayout {
  int dp = 1, fsdp = 1, tp = 1;
  bool operator==(const MeshLayout&) const = default;
};

struct CheckpointContent {
  std::vector<qmesh::NamedTensor> tensors;  // parameters, optimizer state, configuration
  qmesh::LayerContext* fp8 = nullptr;       // its scaling states are saved when delayed
  MeshLayout layout;
  // The fsdp-sharded tensors (parameters and their optimizer slots, each this rank's flat,
  // padded shard) and their unsharded element counts: a checkpoint written by another
  // dp x fsdp split (fsdp >= 2 on both sides, the same tp) is resharded at load.
  std::map<std::string, int64_t> sharded;
};

// Collective over `world`: every rank writes its files, then rank 0 updates `latest`.
void save_checkpoint(const std::string& dir, int step, const CheckpointContent& content,
                     qmesh::Communicator& world);

// Loads the checkpoint `latest` names into `content` and returns its step, resharding the
// fsdp shards when the checkpoint's dp x fsdp split differs. Error (saying what is wrong and
// where) if there is none or it does not match this run's configuration.
int load_latest_checkpoint(const std::string& dir, const CheckpointContent& content, int rank);

}  // namespace train_mlp
