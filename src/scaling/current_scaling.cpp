#include "qmesh/scaling/current_scaling.h"

#include "cuda/scaling.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/fp8.h"
#include "qmesh/ops/amax.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/quantize.h"
#include "scaling/scale_rules.h"

namespace qmesh {

float current_scale(float amax, DType fp8, const Float8CurrentScaling& recipe) {
  validate(recipe);
  return detail::current_scale_rule(amax, fp8_max(fp8), recipe.power_of_two_scales,
                                    recipe.amax_epsilon);
}

void set_current_scale(const QuantizedTensorView& out, const Float8CurrentScaling& recipe,
                       Stream stream) {
  validate(recipe);
  out.validate("set_current_scale output");
  detail::dispatch(
      out.device(), [&] { *out.scale = current_scale(*out.amax, out.dtype(), recipe); },
      [&](auto index) {
        detail::cuda::set_current_scale(index, out.amax, out.scale, fp8_max(out.dtype()),
                                        recipe.power_of_two_scales, recipe.amax_epsilon, stream);
      });
}

void quantize_current_scaling(const TensorView& x, const QuantizedTensorView& out,
                              const Float8CurrentScaling& recipe, Stream stream) {
  validate(recipe);
  out.validate("quantize_current_scaling output");
  check_not_empty(x, "quantize_current_scaling input");
  check_device(x, out.device(), "quantize_current_scaling input");
  amax(x, TensorView(out.amax, DType::kFloat32, Shape{1}, out.device()), stream);
  set_current_scale(out, recipe, stream);
  if (out.has_columnwise())
    cast_transpose(x, out, stream);
  else
    quantize(x, out, stream);
}

}  // namespace qmesh
