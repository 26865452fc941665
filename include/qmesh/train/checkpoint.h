// Checkpoints of a training run (train_mlp, c_trainer, the C API): per rank, the model's
// parameters, the optimizer state, the FP8 scaling state and the run's configuration, in
// <dir>/step-<N>/; <dir>/latest names the newest complete one. Every file is written atomically and
// written only after all ranks finished the previous checkpoint, so a crash never leaves `latest`
// pointing at a partial checkpoint.
#pragma once

#include <string>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/tensor_file.h"

namespace qmesh {

struct CheckpointContent {
  std::vector<NamedTensor> tensors;  // parameters, optimizer state, configuration
  LayerContext* fp8 = nullptr;       // its scaling states are saved when delayed
};

// Collective over `world`: every rank writes its files, then rank 0 updates `latest`.
QMESH_API void save_checkpoint(const std::string& dir, int step, const CheckpointContent& content,
                               Communicator& world);

// Loads the checkpoint `latest` names into `content` and returns its step. Error (saying
// what is wrong and where) if there is none or it does not match this run's configuration.
QMESH_API int load_latest_checkpoint(const std::string& dir, const CheckpointContent& content,
                                     int rank);

}  // namespace qmesh
