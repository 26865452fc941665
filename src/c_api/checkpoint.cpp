// The C API's training checkpoints (qmesh/train/checkpoint.h) and optimizer state access.
#include "qmesh/train/checkpoint.h"

#include <optional>
#include <string>
#include <vector>

#include "boundary.h"
#include "handles.h"
#include "tensor_view.h"

namespace qmesh::capi {
namespace {

std::vector<NamedTensor> named_tensors(const qmesh_named_tensor* tensors, int n, const char* what) {
  require_array(tensors, n, what);
  std::vector<NamedTensor> out;
  for (int i = 0; i < n; ++i) {
    const std::string item = std::string(what) + "[" + std::to_string(i) + "]";
    out.push_back({require(tensors[i].name, (item + ".name").c_str()),
                   to_view(&tensors[i].tensor, (item + ".tensor").c_str())});
  }
  return out;
}

CheckpointContent content(const qmesh_named_tensor* tensors, int n, qmesh_context* context) {
  CheckpointContent out;
  out.tensors = named_tensors(tensors, n, "tensors");
  out.context = context ? context->context.get() : nullptr;
  return out;
}

CheckpointContent training_content(qmesh_context* context, qmesh_parameter* const* params,
                                   int nparams, qmesh_optimizer* opt,
                                   const qmesh_named_tensor* extra, int nextra) {
  return training_checkpoint(*require(context, "context")->context, param_list(params, nparams),
                             *require(opt, "opt")->optimizer,
                             named_tensors(extra, nextra, "extra"));
}

// A step to save (>= 0), or to load (-1: the latest).
void check_step(int step, bool latest_allowed) {
  if (step >= 0 || (latest_allowed && step == -1)) return;
  QMESH_THROW("step is negative (" + std::to_string(step) + ")" +
              (latest_allowed ? "; -1 loads the latest" : ""));
}

int load(qmesh_world* world, const char* directory, int step, const CheckpointContent& c) {
  return load_checkpoint(directory, c, *world->comm,
                         step < 0 ? std::nullopt : std::optional<int>(step));
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
      QMESH_THROW("state index " + std::to_string(index) + " is out of range [0, " +
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
    check_step(step, false);
    qmesh::save_checkpoint(directory, step, content(tensors, ntensors, context), *world->comm);
  });
}

qmesh_status qmesh_checkpoint_load(qmesh_world* world, const char* directory, int step,
                                   const qmesh_named_tensor* tensors, int ntensors,
                                   qmesh_context* context, int* loaded_step) {
  return guard(__func__, [&] {
    require(world, "world");
    require(directory, "directory");
    require(loaded_step, "loaded_step");
    check_step(step, true);
    *loaded_step = load(world, directory, step, content(tensors, ntensors, context));
  });
}

qmesh_status qmesh_checkpoint_load_latest(qmesh_world* world, const char* directory,
                                          const qmesh_named_tensor* tensors, int ntensors,
                                          qmesh_context* context, int* step) {
  return guard(__func__, [&] {
    require(world, "world");
    require(directory, "directory");
    require(step, "step");
    *step = load(world, directory, -1, content(tensors, ntensors, context));
  });
}

qmesh_status qmesh_checkpoint_save_training(qmesh_world* world, const char* directory, int step,
                                            qmesh_context* context, qmesh_parameter* const* params,
                                            int nparams, qmesh_optimizer* opt,
                                            const qmesh_named_tensor* extra, int nextra) {
  return guard(__func__, [&] {
    require(world, "world");
    require(directory, "directory");
    check_step(step, false);
    qmesh::save_checkpoint(directory, step,
                           training_content(context, params, nparams, opt, extra, nextra),
                           *world->comm);
  });
}

qmesh_status qmesh_checkpoint_load_training(qmesh_world* world, const char* directory, int step,
                                            qmesh_context* context, qmesh_parameter* const* params,
                                            int nparams, qmesh_optimizer* opt,
                                            const qmesh_named_tensor* extra, int nextra,
                                            int* loaded_step) {
  return guard(__func__, [&] {
    require(world, "world");
    require(directory, "directory");
    require(loaded_step, "loaded_step");
    check_step(step, true);
    *loaded_step = load(world, directory, step,
                        training_content(context, params, nparams, opt, extra, nextra));
  });
}

}  // extern "C"
