// A trainable parameter: fp32 master weights of this rank's shard and their gradient.
#pragma once

#include <string>

#include "qmesh/tensor.h"

namespace qmesh {

struct Parameter {
  std::string name;  // unique within a model, e.g. "block3.fc1.weight"
  Tensor value;      // fp32, this rank's shard
  Tensor grad;       // fp32, same shape; written (not accumulated) by each backward
  // value and grad are this rank's flat, zero-padded fsdp shard (qmesh/layers/fsdp.h), and
  // backward has already summed grad over the data-parallel ranks: leave it out of GradSync.
  bool fsdp_sharded = false;
};

}  // namespace qmesh
