#include "layers/operand_cast.h"

#include "qmesh/float16.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/quantize.h"
#include "qmesh/scaling/current_scaling.h"

namespace qmesh {

OperandCast::OperandCast(LayerContext& ctx, OperandRole role) : ctx_(ctx), role_(role) {
  if (ctx.recipe() == Recipe::kFp8Delayed) slot_ = ctx.add_operand(role);
}

GemmOperand OperandCast::cast(const TensorView& x, bool columnwise) {
  check_dtype(x, DType::kFloat32, "layer operand");
  switch (ctx_.recipe()) {
    case Recipe::kFp32:
      return GemmOperand::plain(x);
    case Recipe::kBf16: {
      if (!bf16_.data() || !(bf16_.shape() == x.shape))
        bf16_ = Tensor(DType::kBFloat16, x.shape, x.device);
      fp32_to_bf16(x.data_as<float>(), static_cast<uint16_t*>(bf16_.data()),
                   static_cast<size_t>(x.numel()));
      return GemmOperand::plain(bf16_);
    }
    case Recipe::kFp8Delayed:
    case Recipe::kFp8Current:
      break;
  }
  const Shape shape{x.shape.rows(), x.shape.cols()};
  const DType fp8 = ctx_.fp8_dtype(role_);
  if (!fp8_.data().data() || !(fp8_.shape() == shape) || fp8_.has_columnwise() != columnwise)
    fp8_ = QuantizedTensor(fp8, shape, x.device, columnwise);
  QuantizedTensorView q = fp8_.view();
  if (ctx_.recipe() == Recipe::kFp8Current) {
    quantize_current_scaling(x, q, ctx_.current_scaling());
  } else {
    ctx_.scaling().bind(slot_, q);
    if (columnwise)
      cast_transpose(x, q);
    else
      quantize(x, q);
  }
  return GemmOperand::fp8(q);
}

}  // namespace qmesh
