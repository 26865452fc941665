#include "layers/operand_cast.h"

#include "qmesh/float16.h"
#include "qmesh/ops/amax.h"
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
    // Every rank that holds a piece of this tensor must use the same scale (else a sharded
    // GEMM is no longer the unsharded one): reduce the amax over the mesh's amax group.
    const TensorView amax_view(q.amax, DType::kFloat32, Shape{1}, x.device);
    amax(x, amax_view);
    ctx_.mesh().amax_group()->all_reduce(amax_view, ReduceOp::kMax);
    *q.scale = current_scale(*q.amax, fp8, ctx_.current_scaling());
  } else {
    ctx_.scaling().bind(slot_, q);
  }
  if (columnwise)
    cast_transpose(x, q);
  else
    quantize(x, q);
  return GemmOperand::fp8(q);
}

}  // namespace qmesh
