// The global amax reduction: all ranks that hold pieces of one logical tensor must quantize it
// with the same scale, so before the delayed-scaling update the current amaxes of ALL
// operands, packed in one buffer (ScalingStates::current_amax()), are reduced with ONE
// all-reduce(MAX) over the mesh's amax group (every axis except pp).
#pragma once

#include <memory>

#include "qmesh/comm/communicator.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/comm/work.h"
#include "qmesh/export.h"
#include "qmesh/scaling/scaling_states.h"
#include "qmesh/stream.h"

namespace qmesh {

class QMESH_API AmaxReducer {
 public:
  // Reduces over mesh.amax_group(): every mesh axis except the pp role's. This is the group
  // to use: dp, tp and fsdp ranks of one pipeline stage share each tensor's scale, while
  // different pipeline stages hold different layers (and so different tensors).
  explicit AmaxReducer(const Mesh& mesh);

  // Reduces over `group` instead of the mesh-derived one (e.g. a custom data-parallel
  // replica set). Logs a warning, because a group that misses ranks holding shards of the
  // same tensor gives them different scales, and the sharded GEMM is then no longer the
  // unsharded one (a diverged 40B FP8 run was traced to a DP-only group with TP=8).
  // Error if group is null.
  static AmaxReducer with_group_override(std::shared_ptr<Communicator> group);

  // Issues the all-reduce(MAX) of states.current_amax() in place and returns its handle;
  // nothing else may touch the amaxes until it completes. For CUDA states the reduction is
  // ordered on `stream` (the communicator must carry CUDA buffers, e.g. NCCL).
  WorkHandle reduce_async(const ScalingStates& states, Stream stream = {}) const;
  // The same reduction, then wait(comm_timeout()) (blocking), except for CUDA states over
  // a stream-ordered communicator (NCCL), where it is only enqueued on `stream` and the
  // host does not wait (qmesh/comm/stream_ordered.h).
  void reduce(const ScalingStates& states, Stream stream = {}) const;
  // The end-of-step sequence: reduce, then states.update(stream).
  void reduce_and_update(ScalingStates& states, Stream stream = {}) const;

  // The communicator the reduction runs over.
  const std::shared_ptr<Communicator>& group() const { return group_; }

 private:
  explicit AmaxReducer(std::shared_ptr<Communicator> group);
  std::shared_ptr<Communicator> group_;
};

}  // namespace qmesh
