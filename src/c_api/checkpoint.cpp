// The C API's training checkpoints (qmesh/train/checkpoint.h) and optimizer state access.
#include "qmesh/train/checkpoint.h"

#include <string>

#include "boundary.h"
#include "handles.h"
#include "tensor_view.h"

namespace qmesh::capi {
namespace {

CheckpointContent content(const qmesh_named_tensor* tensors, int n, qmesh_context* context) {
  require_array(tensors, n, "tensors");
  CheckpointContent out;
  for (int i = 0; i < n; ++i) {
    const std::string what = "tensors[" + std::to_string(i) + "]";
    out.tensors.push_back({require(tensors[i].name, (what + ".name").c_str()),
                           to_view(&tensors[i].tensor, (what + ".tensor").c_str())});
  }
  out.fp8 = context ? context->context.get() : nullptr;
  return out;
}

}  // namespace
}  // namespace qmesh::capi

using namespace qmesh::capi;

extern "C" {

qmesh_status qmesh_optimizer_state_count(const qmesh_optimizer* opt, int* count) {
  return guard(__func__, [&] {
    require(count, "count");
    *count = int(require(opt, "opt")->optimizer->state().size());
  });
}

qmesh_status qmesh_optimizer_state(qmesh_optimizer* opt, int index, const char** name,
                                   qmesh_tensor* tensor) {
  return guard(__func__, [&] {
    require(opt, "opt");
    require(name, "name");
    require(tensor, "tensor");
    if (opt->state.empty()) opt->state = opt->optimizer->state();
    if (index < 0 || size_t(index) >= opt->state.size())
      throw ArgumentError("state index " + std::to_string(index) + " is out of range [0, " +
                          std::to_string(opt->state.size()) + ")");
    const auto& [state_name, state] = opt->state[size_t(index)];
    *tensor = to_c(*state);
    *name = state_name.c_str();
  });
}

qmesh_status qmesh_checkpoint_save(qmesh_world* world, const char* directory, int step,
                                   const qmesh_named_tensor* tensors, int ntensors,
                                   qmesh_context* context) {
  return guard(__func__, [&] {
    require(world, "world");
    require(directory, "directory");
    if (step < 0) throw ArgumentError("step is negative (" + std::to_string(step) + ")");
    qmesh::save_checkpoint(directory, step, content(tensors, ntensors, context), *world->comm);
  });
}

qmesh_status qmesh_checkpoint_load_latest(qmesh_world* world, const char* directory,
                                          const qmesh_named_tensor* tensors, int ntensors,
                                          qmesh_context* context, int* step) {
  return guard(__func__, [&] {
    require(world, "world");
    require(directory, "directory");
    require(step, "step");
    *step = qmesh::load_latest_checkpoint(directory, content(tensors, ntensors, context),
                                          world->comm->rank());
  });
}

}  // extern "C"
