#include "layers/operand_cast.h"

#include "layers/activation_buffer.h"
#include "qmesh/comm/stream_ordered.h"
#include "qmesh/error.h"
#include "qmesh/layers/fp8_stats.h"
#include "qmesh/ops/activation_cast.h"
#include "qmesh/ops/amax.h"
#include "qmesh/ops/bias.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/convert.h"
#include "qmesh/ops/dbias_quantize.h"
#include "qmesh/ops/gelu.h"
#include "qmesh/ops/layer_norm.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "qmesh/ops/norm_forward.h"
#include "qmesh/ops/quantize.h"
#include "qmesh/scaling/current_scaling.h"

namespace qmesh {

namespace {

// norm_forward of CastFusion::Kind::kLayerNorm, writing `codes` or else `amax`.
void layer_norm_cast(const TensorView& x, const CastFusion& fusion,
                     const QuantizedTensorView& codes, const TensorView& amax, Stream stream) {
  NormOutputs out;
  out.codes = codes;
  out.amax = amax;
  out.mean = fusion.mean;
  out.rstd = fusion.rstd;
  norm_forward(x, fusion.gamma, fusion.beta, NormSpec{NormType::kLayerNorm, fusion.eps, false}, out,
               stream);
}

}  // namespace

OperandCast::OperandCast(LayerContext& ctx, OperandRole role) : ctx_(ctx), role_(role) {
  if (ctx.recipe() == Recipe::kFp8Delayed) slot_ = ctx.add_operand(role);
  if (ctx.is_fp8() && ctx.fp8_stats()) stats_id_ = ctx.fp8_stats()->add(role);
}

TensorView OperandCast::apply_separately(const TensorView& x, const CastFusion& fusion,
                                         bool want_fp32) {
  const Stream stream = ctx_.stream();
  TensorView v = x;
  if (fusion.kind != CastFusion::Kind::kNone ||
      (x.dtype != DType::kFloat32 && (want_fp32 || !fusion.dbias.empty()))) {
    v = ensure_tensor(activated_, DType::kFloat32, x.shape, x.device);
    if (fusion.kind == CastFusion::Kind::kGelu)
      gelu(x, v, stream);
    else if (fusion.kind == CastFusion::Kind::kLayerNorm)
      layer_norm_forward(x, fusion.gamma, fusion.beta, fusion.eps, v, fusion.mean, fusion.rstd,
                         stream);
    else if (fusion.kind == CastFusion::Kind::kDgelu)
      dgelu(x, fusion.pre, v, stream);
    else
      convert_to_fp32(x, v, stream);
  }
  if (!fusion.dbias.empty()) bias_grad(v, fusion.dbias, stream);
  return v;
}

void OperandCast::quantize_fused(const TensorView& x, const CastFusion& fusion, bool columnwise,
                                 const QuantizedTensorView& q) {
  const Stream stream = ctx_.stream();
  switch (fusion.kind) {
    case CastFusion::Kind::kGelu:
      return gelu_cast_transpose(x, q, stream);
    case CastFusion::Kind::kDgelu:
      return dgelu_dbias_cast_transpose(x, fusion.pre, q, fusion.dbias, stream);
    case CastFusion::Kind::kLayerNorm:
      return layer_norm_cast(x, fusion, q, {}, stream);
    case CastFusion::Kind::kNone:
      if (!fusion.dbias.empty()) return dbias_quantize(x, q, fusion.dbias, stream);
      if (columnwise) return cast_transpose(x, q, stream);
      return quantize(x, q, stream);
  }
}

GemmOperand OperandCast::cast_block(const TensorView& x_in, bool columnwise,
                                    const CastFusion& fusion) {
  const Float8BlockScaling& recipe = ctx_.block_scaling();
  int block_dim = recipe.x_block_scaling_dim;
  QParams params = recipe.fp8_quant_fwd_inp;
  if (role_ == OperandRole::kWeight) {
    block_dim = recipe.w_block_scaling_dim;
    params = recipe.fp8_quant_fwd_weight;
  } else if (role_ == OperandRole::kGradOutput) {
    block_dim = recipe.grad_block_scaling_dim;
    params = recipe.fp8_quant_bwd_grad;
  }
  const BlockShape block = block_dim == 2 ? BlockShape::k128x128 : BlockShape::k1x128;
  // GELU or its backward first, in its own pass; the bias gradient in the block cast.
  CastFusion activation = fusion;
  activation.dbias = TensorView();
  const TensorView x = apply_separately(x_in, activation, false);
  const Shape shape{x.shape.rows(), x.shape.cols()};
  if (!block_.data().data() || !(block_.shape() == shape) || block_.block() != block ||
      (columnwise && !block_.has_columnwise()))
    block_ = BlockQuantizedTensor(ctx_.fp8_dtype(role_), shape, block, x.device, columnwise);
  BlockQuantizedTensorView out = block_.view();
  if (!columnwise) out.data_t = out.scale_inv_t = TensorView();  // storage kept, not written
  if (fusion.dbias.empty())
    block_quantize(x, out, params, ctx_.stream());
  else
    block_dbias_quantize(x, out, fusion.dbias, params, ctx_.stream());
  return GemmOperand::fp8_block(out);
}

GemmOperand OperandCast::cast_mxfp8(const TensorView& x_in, bool columnwise,
                                    const CastFusion& fusion) {
  // GELU, its backward or the LayerNorm first, in its own pass; the bias gradient in the cast.
  CastFusion activation = fusion;
  activation.dbias = TensorView();
  const TensorView x = apply_separately(x_in, activation, false);
  const Shape shape{x.shape.rows(), x.shape.cols()};
  if (mx_.empty() || !(mx_.shape() == shape) || (columnwise && !mx_.has_columnwise()))
    mx_ = MxFp8Tensor(ctx_.fp8_dtype(role_), shape, x.device, columnwise);
  MxFp8TensorView out = mx_.view();
  if (!columnwise) out.data_t = out.scale_t = TensorView();  // storage kept, not written
  const float margin = ctx_.mxfp8_scaling().margin;
  if (fusion.dbias.empty())
    mxfp8_quantize(x, out, margin, ctx_.stream());
  else
    mxfp8_dbias_quantize(x, out, fusion.dbias, margin, ctx_.stream());
  return GemmOperand::mxfp8(out);
}

GemmOperand OperandCast::cast(const TensorView& x_in, bool columnwise,
                              const CastFusion& fusion_in) {
  QMESH_CHECK(x_in.dtype == DType::kFloat32 || x_in.dtype == DType::kBFloat16,
              "layer operand: must be fp32 or bf16, got ", dtype_name(x_in.dtype));
  check_device(x_in, ctx_.device(), "layer operand");
  QMESH_CHECK(fusion_in.dbias.empty() || fusion_in.kind == CastFusion::Kind::kNone ||
                  fusion_in.kind == CastFusion::Kind::kDgelu,
              "OperandCast: a bias gradient is summed over a gradient, not over GELU's or a "
              "LayerNorm's output");
  QMESH_CHECK(fusion_in.kind != CastFusion::Kind::kDgelu || !fusion_in.dbias.empty(),
              "OperandCast: GELU's backward is fused with the bias gradient; pass dbias");
  const Stream stream = ctx_.stream();
  // Without FP8, or with FP8 statistics (which compare the operand with its codes in fp32),
  // the fusion runs as separate passes and the cast sees f(x).
  TensorView x = x_in;
  CastFusion fusion = fusion_in;
  if (!ctx_.is_fp8() || stats_id_ >= 0) {
    x = apply_separately(x_in, fusion_in, ctx_.recipe() == Recipe::kFp32 || stats_id_ >= 0);
    fusion = CastFusion{};
  }
  switch (ctx_.recipe()) {
    case Recipe::kFp32:
      return GemmOperand::plain(x);
    case Recipe::kBf16: {
      if (x.dtype == DType::kBFloat16) return GemmOperand::plain(x);  // a bf16 activation
      if (!bf16_.data() || !(bf16_.shape() == x.shape))
        bf16_ = Tensor(DType::kBFloat16, x.shape, x.device);
      convert_to_bf16(x, bf16_, stream);
      return GemmOperand::plain(bf16_);
    }
    case Recipe::kFp8Block:
      return cast_block(x, columnwise, fusion);
    case Recipe::kMxfp8:
      return cast_mxfp8(x, columnwise, fusion);
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
    switch (fusion.kind) {
      case CastFusion::Kind::kNone:
        amax(x, amax_view, stream);
        break;
      case CastFusion::Kind::kGelu:
        gelu_amax(x, amax_view, stream);
        break;
      case CastFusion::Kind::kDgelu:
        dgelu_amax(x, fusion.pre, amax_view, stream);
        break;
      case CastFusion::Kind::kLayerNorm:  // the cast's pass writes the same mean and rstd
        layer_norm_cast(x, fusion, {}, amax_view, stream);
        break;
    }
    all_reduce_in_stream_order(*ctx_.mesh().amax_group(), amax_view, ReduceOp::kMax, stream);
    set_current_scale(q, ctx_.current_scaling(), stream);
  } else {
    ctx_.scaling().bind(slot_, q);
  }
  quantize_fused(x, fusion, columnwise, q);
  if (stats_id_ >= 0) {
    const bool delayed = ctx_.recipe() == Recipe::kFp8Delayed;
    ctx_.fp8_stats()->record(stats_id_, x, q, delayed ? ctx_.delayed_scaling().margin : 0.0f);
  }
  return GemmOperand::fp8(q);
}

}  // namespace qmesh
