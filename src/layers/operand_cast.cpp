#include "layers/operand_cast.h"

#include "qmesh/comm/stream_ordered.h"
#include "qmesh/layers/fp8_stats.h"
#include "qmesh/ops/amax.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/convert.h"
#include "qmesh/ops/quantize.h"
#include "qmesh/scaling/current_scaling.h"

namespace qmesh {

OperandCast::OperandCast(LayerContext& ctx, OperandRole role) : ctx_(ctx), role_(role) {
  if (ctx.recipe() == Recipe::kFp8Delayed) slot_ = ctx.add_operand(role);
  if (ctx.is_fp8() && ctx.fp8_stats()) stats_id_ = ctx.fp8_stats()->add(role);
}

GemmOperand OperandCast::cast(const TensorView& x, bool columnwise) {
  check_dtype(x, DType::kFloat32, "layer operand");
  check_device(x, ctx_.device(), "layer operand");
  const Stream stream = ctx_.stream();
  switch (ctx_.recipe()) {
    case Recipe::kFp32:
      return GemmOperand::plain(x);
    case Recipe::kBf16: {
      if (!bf16_.data() || !(bf16_.shape() == x.shape))
        bf16_ = Tensor(DType::kBFloat16, x.shape, x.device);
      convert_to_bf16(x, bf16_, stream);
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
    // On CUDA the amax, its reduction and the scale stay on the device, ordered on the stream.
    amax(x, amax_view, stream);
    all_reduce_in_stream_order(*ctx_.mesh().amax_group(), amax_view, ReduceOp::kMax, stream);
    set_current_scale(q, ctx_.current_scaling(), stream);
  } else {
    ctx_.scaling().bind(slot_, q);
  }
  if (columnwise)
    cast_transpose(x, q, stream);
  else
    quantize(x, q, stream);
  if (stats_id_ >= 0) {
    const bool delayed = ctx_.recipe() == Recipe::kFp8Delayed;
    ctx_.fp8_stats()->record(stats_id_, x, q, delayed ? ctx_.delayed_scaling().margin : 0.0f);
  }
  return GemmOperand::fp8(q);
}

}  // namespace qmesh
