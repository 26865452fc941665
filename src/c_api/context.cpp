// The C API's layer context: recipe, FP8 scaling, placement.
#include <cstddef>
#include <string>

#include "boundary.h"
#include "handles.h"
#include "tensor_view.h"

using namespace qmesh::capi;

extern "C" {

void qmesh_context_config_init(qmesh_context_config* config) {
  if (config == nullptr) return;
  const qmesh::DelayedScaling delayed;
  const qmesh::Float8CurrentScaling current;
  const qmesh::Float8BlockScaling block;
  *config = qmesh_context_config{};
  config->struct_size = sizeof(qmesh_context_config);
  config->recipe = QMESH_RECIPE_FP8_DELAYED;
  config->amax_history_len = delayed.amax_history_len;
  config->margin = delayed.margin;
  config->amax_algo = static_cast<qmesh_amax_algo>(delayed.amax_compute_algo);
  config->delayed_format = static_cast<qmesh_fp8_format>(delayed.fp8_format);
  config->current_format = static_cast<qmesh_fp8_format>(current.fp8_format);
  config->power_of_two_scales = current.power_of_two_scales;
  config->amax_epsilon = current.amax_epsilon;
  config->overlap = QMESH_OVERLAP_NONE;
  config->block_format = static_cast<qmesh_fp8_format>(block.fp8_format);
  config->block_power_of_two_scales = block.fp8_quant_fwd_inp.power_2_scale;
  config->device.kind = QMESH_DEVICE_HOST;
}

qmesh_status qmesh_context_create(const qmesh_mesh* mesh, const qmesh_context_config* config,
                                  qmesh_context** context) {
  return guard(__func__, [&] {
    require(mesh, "mesh");
    require(context, "context");
    qmesh_context_config defaults;
    qmesh_context_config_init(&defaults);
    // (A program built before the NVFP4 fields gets their defaults.)
    const qmesh_context_config c =
        read_config(config, defaults, offsetof(qmesh_context_config, nvfp4_disable_rht),
                    "qmesh_context_config");
    const auto recipe = static_cast<qmesh::Recipe>(
        checked_enum(c.recipe, QMESH_RECIPE_FP32, QMESH_RECIPE_NVFP4, "config.recipe"));
    qmesh::DelayedScaling delayed;
    delayed.amax_history_len = c.amax_history_len;
    delayed.margin = c.margin;
    delayed.amax_compute_algo = static_cast<qmesh::AmaxComputeAlgo>(
        checked_enum(c.amax_algo, QMESH_AMAX_MAX, QMESH_AMAX_MOST_RECENT, "config.amax_algo"));
    delayed.fp8_format = static_cast<qmesh::Fp8Format>(
        checked_enum(c.delayed_format, QMESH_FP8_HYBRID, QMESH_FP8_E4M3, "config.delayed_format"));
    qmesh::Float8CurrentScaling current;
    current.fp8_format = static_cast<qmesh::Fp8Format>(
        checked_enum(c.current_format, QMESH_FP8_HYBRID, QMESH_FP8_E4M3, "config.current_format"));
    current.power_of_two_scales = c.power_of_two_scales != 0;
    current.amax_epsilon = c.amax_epsilon;
    qmesh::Float8BlockScaling block;
    block.fp8_format = static_cast<qmesh::Fp8Format>(
        checked_enum(c.block_format, QMESH_FP8_HYBRID, QMESH_FP8_E4M3, "config.block_format"));
    for (qmesh::QParams* q :
         {&block.fp8_quant_fwd_inp, &block.fp8_quant_fwd_weight, &block.fp8_quant_bwd_grad})
      q->power_2_scale = c.block_power_of_two_scales != 0;
    qmesh::MXFP8BlockScaling mxfp8;
    mxfp8.emulate = c.emulate != 0;
    qmesh::NVFP4BlockScaling nvfp4;
    nvfp4.disable_rht = c.nvfp4_disable_rht != 0;
    nvfp4.disable_stochastic_rounding = c.nvfp4_disable_stochastic_rounding != 0;
    nvfp4.disable_2d_quantization = c.nvfp4_disable_2d_quantization != 0;
    nvfp4.emulate = c.emulate != 0;
    const auto overlap = static_cast<qmesh::Overlap>(
        checked_enum(c.overlap, QMESH_OVERLAP_NONE, QMESH_OVERLAP_BIDIR, "config.overlap"));
    const qmesh::Placement placement{to_device(c.device, "config"), qmesh::Stream{c.stream},
                                     qmesh::Stream{c.comm_stream}};
    auto out = std::make_unique<qmesh_context>();
    out->context =
        std::make_unique<qmesh::LayerContext>(*mesh->mesh, recipe,
                                              qmesh::LayerContextOptions{.delayed = delayed,
                                                                         .current = current,
                                                                         .block = block,
                                                                         .mxfp8 = mxfp8,
                                                                         .nvfp4 = nvfp4,
                                                                         .placement = placement,
                                                                         .overlap = overlap});
    *context = out.release();
  });
}

qmesh_status qmesh_context_destroy(qmesh_context* context) {
  return guard(__func__, [&] { delete context; });
}

qmesh_status qmesh_context_end_step(qmesh_context* context) {
  return guard(__func__, [&] { require(context, "context")->context->end_step(); });
}

}  // extern "C"
