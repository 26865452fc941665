// A trainable parameter: fp32 master weights of this rank's shard and their gradient.
#pragma once

#include <cstdint>
#include <string>

#include "qmesh/tensor.h"

namespace qmesh {

struct Parameter {
  std::string name;  // unique within a model, e.g. "block3.fc1.weight"
  Tensor value;      // fp32, this rank's shard
  Tensor grad;       // fp32, same shape; written (not accumulated) by each backward
  // > 0: value and grad are this rank's flat, zero-padded fsdp shard (qmesh/layers/fsdp.h)
  // of a tensor of fsdp_numel elements, and backward has already summed grad over the
  // data-parallel ranks: leave it out of GradSync.
  int64_t fsdp_numel = 0;

  bool fsdp_sharded() const { return fsdp_numel > 0; }
};

}  // namespace qmesh
