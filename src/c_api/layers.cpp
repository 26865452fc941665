// The C API's layers (LayerNormMLP, Dense) and their parameters.
#include <string>

#include "boundary.h"
#include "handles.h"
#include "tensor_view.h"

namespace qmesh::capi {
namespace {

// What every layer handle does the same way.
template <class Handle>
qmesh_status forward(const char* function, Handle* h, const qmesh_tensor* x, qmesh_tensor* y) {
  return guard(function, [&] {
    require(h, "layer");
    require(y, "y");
    *y = to_c(h->layer->forward(to_view(x, "x")));
  });
}

template <class Handle>
qmesh_status backward(const char* function, Handle* h, const qmesh_tensor* dy, qmesh_tensor* dx) {
  return guard(function, [&] {
    require(h, "layer");
    require(dx, "dx");
    *dx = to_c(h->layer->backward(to_view(dy, "dy")));
  });
}

template <class Handle>
qmesh_status parameter_count(const char* function, const Handle* h, int* count) {
  return guard(function,
               [&] { *require(count, "count") = int(require(h, "layer")->params.size()); });
}

template <class Handle>
qmesh_status parameter(const char* function, Handle* h, int index, qmesh_parameter** p) {
  return guard(function, [&] {
    require(h, "layer");
    require(p, "parameter");
    if (index < 0 || size_t(index) >= h->params.size())
      QMESH_THROW("parameter index " + std::to_string(index) + " is out of range [0, " +
                  std::to_string(h->params.size()) + ")");
    *p = handle(h->params[size_t(index)]);
  });
}

}  // namespace
}  // namespace qmesh::capi

using namespace qmesh::capi;

extern "C" {

qmesh_status qmesh_parameter_name(const qmesh_parameter* p, const char** name) {
  return guard(__func__,
               [&] { *require(name, "name") = param(require(p, "parameter"))->name.c_str(); });
}

qmesh_status qmesh_parameter_value(const qmesh_parameter* p, qmesh_tensor* value) {
  return guard(__func__,
               [&] { *require(value, "value") = to_c(param(require(p, "parameter"))->value); });
}

qmesh_status qmesh_parameter_grad(const qmesh_parameter* p, qmesh_tensor* grad) {
  return guard(__func__,
               [&] { *require(grad, "grad") = to_c(param(require(p, "parameter"))->grad); });
}

void qmesh_layernorm_mlp_config_init(qmesh_layernorm_mlp_config* config) {
  if (config == nullptr) return;
  const qmesh::LayerNormMLPOptions options;
  *config = qmesh_layernorm_mlp_config{};
  config->struct_size = sizeof(qmesh_layernorm_mlp_config);
  config->sequence_parallel = options.sequence_parallel;
  config->layer_norm_eps = options.layer_norm_eps;
  config->regather_input = options.gathered_input == qmesh::GatheredInput::kRegather;
}

qmesh_status qmesh_layernorm_mlp_create(qmesh_context* context, const char* name,
                                        const qmesh_layernorm_mlp_config* config,
                                        qmesh_layernorm_mlp** layer) {
  return guard(__func__, [&] {
    require(context, "context");
    require(name, "name");
    require(layer, "layer");
    qmesh_layernorm_mlp_config defaults;
    qmesh_layernorm_mlp_config_init(&defaults);
    const qmesh_layernorm_mlp_config c = read_config(
        config, defaults, sizeof(qmesh_layernorm_mlp_config), "qmesh_layernorm_mlp_config");
    const qmesh::LayerNormMLPOptions options{
        c.sequence_parallel != 0, c.layer_norm_eps, std::nullopt,
        c.regather_input ? qmesh::GatheredInput::kRegather : qmesh::GatheredInput::kSave};
    auto out = std::make_unique<qmesh_layernorm_mlp>();
    out->layer = std::make_unique<qmesh::LayerNormMLP>(name, c.hidden, c.ffn, options,
                                                       *context->context, c.seed);
    out->params = out->layer->parameters();
    *layer = out.release();
  });
}

qmesh_status qmesh_layernorm_mlp_destroy(qmesh_layernorm_mlp* layer) {
  return guard(__func__, [&] { delete layer; });
}

qmesh_status qmesh_layernorm_mlp_forward(qmesh_layernorm_mlp* layer, const qmesh_tensor* x,
                                         qmesh_tensor* y) {
  return forward(__func__, layer, x, y);
}

qmesh_status qmesh_layernorm_mlp_backward(qmesh_layernorm_mlp* layer, const qmesh_tensor* dy,
                                          qmesh_tensor* dx) {
  return backward(__func__, layer, dy, dx);
}

qmesh_status qmesh_layernorm_mlp_parameter_count(const qmesh_layernorm_mlp* layer, int* count) {
  return parameter_count(__func__, layer, count);
}

qmesh_status qmesh_layernorm_mlp_parameter(qmesh_layernorm_mlp* layer, int index,
                                           qmesh_parameter** p) {
  return parameter(__func__, layer, index, p);
}

void qmesh_dense_config_init(qmesh_dense_config* config) {
  if (config == nullptr) return;
  const qmesh::DenseOptions options;
  *config = qmesh_dense_config{};
  config->struct_size = sizeof(qmesh_dense_config);
  config->parallelism = QMESH_DENSE_UNSHARDED;
  config->sequence_parallel = options.sequence_parallel;
  config->bias = options.bias;
  config->activation = QMESH_ACTIVATION_NONE;
}

qmesh_status qmesh_dense_create(qmesh_context* context, const char* name,
                                const qmesh_dense_config* config, qmesh_dense** layer) {
  return guard(__func__, [&] {
    require(context, "context");
    require(name, "name");
    require(layer, "layer");
    qmesh_dense_config defaults;
    qmesh_dense_config_init(&defaults);
    const qmesh_dense_config c =
        read_config(config, defaults, sizeof(qmesh_dense_config), "qmesh_dense_config");
    qmesh::DenseOptions options;
    options.parallelism = static_cast<qmesh::DenseParallelism>(
        checked_enum(c.parallelism, QMESH_DENSE_UNSHARDED, QMESH_DENSE_ROW, "config.parallelism"));
    options.sequence_parallel = c.sequence_parallel != 0;
    options.bias = c.bias != 0;
    options.activation = static_cast<qmesh::DenseActivation>(checked_enum(
        c.activation, QMESH_ACTIVATION_NONE, QMESH_ACTIVATION_GELU, "config.activation"));
    options.gathered_input =
        c.regather_input ? qmesh::GatheredInput::kRegather : qmesh::GatheredInput::kSave;
    auto out = std::make_unique<qmesh_dense>();
    out->layer = std::make_unique<qmesh::Dense>(name, c.in_features, c.out_features, options,
                                                *context->context, c.seed);
    out->params = out->layer->parameters();
    *layer = out.release();
  });
}

qmesh_status qmesh_dense_destroy(qmesh_dense* layer) {
  return guard(__func__, [&] { delete layer; });
}

qmesh_status qmesh_dense_forward(qmesh_dense* layer, const qmesh_tensor* x, qmesh_tensor* y) {
  return forward(__func__, layer, x, y);
}

qmesh_status qmesh_dense_backward(qmesh_dense* layer, const qmesh_tensor* dy, qmesh_tensor* dx) {
  return backward(__func__, layer, dy, dx);
}

qmesh_status qmesh_dense_parameter_count(const qmesh_dense* layer, int* count) {
  return parameter_count(__func__, layer, count);
}

qmesh_status qmesh_dense_parameter(qmesh_dense* layer, int index, qmesh_parameter** p) {
  return parameter(__func__, layer, index, p);
}

}  // extern "C"
