#include "qmesh/scaling/amax_reducer.h"

#include "qmesh/comm/stream_ordered.h"
#include "qmesh/logging.h"

namespace qmesh {

AmaxReducer::AmaxReducer(std::shared_ptr<Communicator> group) : group_(std::move(group)) {
  QMESH_CHECK(group_ != nullptr, "AmaxReducer needs a communicator, got null");
}

AmaxReducer::AmaxReducer(const Mesh& mesh) : AmaxReducer(mesh.amax_group()) {}

AmaxReducer AmaxReducer::with_group_override(std::shared_ptr<Communicator> group) {
  AmaxReducer reducer(std::move(group));
  QMESH_LOG_WARN("amax reduction group overridden by hand (", reducer.group_->size(),
                 " ranks) instead of Mesh::amax_group(); every rank holding a shard of a "
                 "tensor must be in the group, or their FP8 scales diverge");
  return reducer;
}

WorkHandle AmaxReducer::reduce_async(const ScalingStates& states, Stream stream) const {
  // One collective for every operand: the current amaxes are row 0 of the packed history.
  return group_->all_reduce_async(states.current_amax(), ReduceOp::kMax, stream);
}

void AmaxReducer::reduce(const ScalingStates& states, Stream stream) const {
  all_reduce_in_stream_order(*group_, states.current_amax(), ReduceOp::kMax, stream);
}

void AmaxReducer::reduce_and_update(ScalingStates& states, Stream stream) const {
  reduce(states, stream);
  states.update(stream);
}

}  // namespace qmesh
