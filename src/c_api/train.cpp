// The C API's training utilities: the MSE loss, gradient sync, optimizers.
#include <string>

#include "boundary.h"
#include "handles.h"
#include "qmesh/train/loss.h"
#include "tensor_view.h"

namespace qmesh::capi {

std::vector<Parameter*> param_list(qmesh_parameter* const* params, int n) {
  require_array(params, n, "params");
  std::vector<Parameter*> out;
  for (int i = 0; i < n; ++i) {
    if (params[i] == nullptr) QMESH_THROW("params[" + std::to_string(i) + "] is NULL");
    out.push_back(param(params[i]));
  }
  return out;
}

}  // namespace qmesh::capi

using namespace qmesh::capi;

extern "C" {

qmesh_status qmesh_mse_loss(const qmesh_tensor* y, const qmesh_tensor* target, double global_count,
                            const qmesh_tensor* dy, const qmesh_tensor* sum_sq, void* stream) {
  return guard(__func__, [&] {
    qmesh::mse_loss(to_view(y, "y"), to_view(target, "target"), global_count, to_view(dy, "dy"),
                    to_view(sum_sq, "sum_sq"), qmesh::Stream{stream});
  });
}

qmesh_status qmesh_mse_loss_global(const qmesh_mesh* mesh, int split_over_tp, const qmesh_tensor* y,
                                   const qmesh_tensor* target, const qmesh_tensor* dy, void* stream,
                                   double* loss) {
  return guard(__func__, [&] {
    require(mesh, "mesh");
    require(loss, "loss");
    *loss = qmesh::mse_loss(
        *mesh->mesh,
        split_over_tp ? qmesh::LossOutputs::kSplitOverTp : qmesh::LossOutputs::kReplicatedOverTp,
        to_view(y, "y"), to_view(target, "target"), to_view(dy, "dy"), qmesh::Stream{stream});
  });
}

qmesh_status qmesh_grad_sync_create(const qmesh_mesh* mesh, const char* axis,
                                    qmesh_parameter* const* params, int nparams,
                                    size_t bucket_bytes, void* stream, qmesh_grad_sync** sync) {
  return guard(__func__, [&] {
    require(mesh, "mesh");
    require(axis, "axis");
    require(sync, "sync");
    auto out = std::make_unique<qmesh_grad_sync>();
    out->sync = std::make_unique<qmesh::GradSync>(
        mesh->mesh->axis(axis), param_list(params, nparams), bucket_bytes, qmesh::Stream{stream});
    *sync = out.release();
  });
}

qmesh_status qmesh_grad_sync_destroy(qmesh_grad_sync* sync) {
  return guard(__func__, [&] { delete sync; });
}

qmesh_status qmesh_grad_sync_ready(qmesh_grad_sync* sync, qmesh_parameter* const* params,
                                   int nparams) {
  return guard(__func__, [&] { require(sync, "sync")->sync->ready(param_list(params, nparams)); });
}

qmesh_status qmesh_grad_sync_finish(qmesh_grad_sync* sync) {
  return guard(__func__, [&] { require(sync, "sync")->sync->finish(); });
}

void qmesh_adamw_config_init(qmesh_adamw_config* config) {
  if (config == nullptr) return;
  const qmesh::AdamWOptions o;
  *config =
      qmesh_adamw_config{sizeof(qmesh_adamw_config), o.lr, o.beta1, o.beta2, o.eps, o.weight_decay};
}

void qmesh_sgd_config_init(qmesh_sgd_config* config) {
  if (config == nullptr) return;
  const qmesh::SgdOptions o;
  *config = qmesh_sgd_config{sizeof(qmesh_sgd_config), o.lr, o.momentum, o.weight_decay};
}

qmesh_status qmesh_optimizer_create_adamw(qmesh_parameter* const* params, int nparams,
                                          const qmesh_adamw_config* config, void* stream,
                                          qmesh_optimizer** opt) {
  return guard(__func__, [&] {
    require(opt, "opt");
    qmesh_adamw_config defaults;
    qmesh_adamw_config_init(&defaults);
    const qmesh_adamw_config c =
        read_config(config, defaults, sizeof(qmesh_adamw_config), "qmesh_adamw_config");
    auto out = std::make_unique<qmesh_optimizer>();
    out->optimizer =
        qmesh::make_adamw(param_list(params, nparams),
                          {c.lr, c.beta1, c.beta2, c.eps, c.weight_decay}, qmesh::Stream{stream});
    *opt = out.release();
  });
}

qmesh_status qmesh_optimizer_create_sgd(qmesh_parameter* const* params, int nparams,
                                        const qmesh_sgd_config* config, void* stream,
                                        qmesh_optimizer** opt) {
  return guard(__func__, [&] {
    require(opt, "opt");
    qmesh_sgd_config defaults;
    qmesh_sgd_config_init(&defaults);
    const qmesh_sgd_config c =
        read_config(config, defaults, sizeof(qmesh_sgd_config), "qmesh_sgd_config");
    auto out = std::make_unique<qmesh_optimizer>();
    out->optimizer = qmesh::make_sgd(param_list(params, nparams),
                                     {c.lr, c.momentum, c.weight_decay}, qmesh::Stream{stream});
    *opt = out.release();
  });
}

qmesh_status qmesh_optimizer_destroy(qmesh_optimizer* opt) {
  return guard(__func__, [&] { delete opt; });
}

qmesh_status qmesh_optimizer_step(qmesh_optimizer* opt) {
  return guard(__func__, [&] { require(opt, "opt")->optimizer->step(); });
}

qmesh_status qmesh_optimizer_set_lr(qmesh_optimizer* opt, float lr) {
  return guard(__func__, [&] { require(opt, "opt")->optimizer->set_lr(lr); });
}

}  // extern "C"
