#include "qmesh/layers/dense.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>

#include "layers/activation_buffer.h"
#include "layers/forward_epilogue.h"
#include "layers/fsdp_layer.h"
#include "layers/gather_buffer.h"
#include "layers/operand_cast.h"
#include "qmesh/comm/stream_ordered.h"
#include "qmesh/copy.h"
#include "qmesh/error.h"
#include "qmesh/ops/add.h"
#include "qmesh/ops/bias.h"
#include "qmesh/ops/convert.h"
#include "qmesh/ops/gelu.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/ops/transpose.h"
#include "qmesh/overlap/collective_gemm.h"
#include "qmesh/overlap/operand_gather.h"
#include "qmesh/random.h"

namespace qmesh {

namespace {

Shape with_rows(int64_t rows, int64_t cols) { return Shape{rows, cols}; }

// The first `rows` rows of a row-major 2-D tensor.
}  // namespace

struct Dense::Impl {
  Impl(std::string name_in, int64_t in, int64_t out, DenseOptions opt, LayerContext& context,
       uint64_t seed)
      : name(std::move(name_in)),
        options(opt),
        ctx(context),
        tp(context.mesh().role(context.mesh().resource().tp)),
        overlap(opt.overlap.value_or(context.overlap())),
        x_cast(context, OperandRole::kInput),
        w_cast(context, OperandRole::kWeight),
        dy_cast(context, OperandRole::kGradOutput),
        sharding(context) {
    const int tp_size = tp->size();
    QMESH_CHECK(in >= 1 && out >= 1, name, ": feature counts must be >= 1, got in=", in,
                " out=", out);
    QMESH_CHECK(opt.parallelism != DenseParallelism::kNone || !opt.sequence_parallel, name,
                ": sequence_parallel needs column or row parallelism");
    QMESH_CHECK(
        opt.parallelism != DenseParallelism::kRow || opt.activation == DenseActivation::kNone, name,
        ": a row-parallel layer cannot fuse GELU (its output is a partial sum)");
    QMESH_CHECK(opt.output_dtype == DType::kFloat32 || opt.output_dtype == DType::kBFloat16, name,
                ": output_dtype must be fp32 or bf16, got ", dtype_name(opt.output_dtype));
    QMESH_CHECK(context.recipe() != Recipe::kFp32 || opt.output_dtype == DType::kFloat32, name,
                ": the fp32 recipe's GEMMs write fp32 (cuBLASLt has no fp32 x fp32 -> bf16 GEMM); "
                "set output_dtype fp32");
    QMESH_CHECK(opt.parallelism != DenseParallelism::kRow || opt.output_dtype == DType::kFloat32,
                name,
                ": a row-parallel layer's output is reduced over tp in fp32; set output_dtype "
                "fp32");
    QMESH_CHECK(opt.bias || opt.activation == DenseActivation::kNone, name,
                ": GELU is fused with the bias; enable the bias");
    QMESH_CHECK(
        opt.gelu_split != DenseGeluSplit::kProducer || opt.activation == DenseActivation::kGelu,
        name, ": DenseGeluSplit::kProducer needs activation kGelu");
    QMESH_CHECK(
        opt.gelu_split != DenseGeluSplit::kConsumer || opt.activation == DenseActivation::kNone,
        name, ": DenseGeluSplit::kConsumer applies GELU to its input; set activation kNone");
    if (opt.sequence_parallel && context.device().is_cuda()) {
      const Placement& place = context.placement();
      QMESH_CHECK(place.stream.handle && place.comm_stream.handle &&
                      place.stream.handle != place.comm_stream.handle,
                  name, ": sequence_parallel on ", context.device().str(),
                  " needs two CUDA streams in the context's Placement: `stream` for the GEMMs "
                  "and `comm_stream` for the collective GEMMs' transfers (non-null, different)");
    }
    in_local = in;
    out_local = out;
    if (opt.parallelism == DenseParallelism::kColumn) {
      QMESH_CHECK(out % tp_size == 0, name, ": out_features ", out,
                  " is not divisible by the tensor-parallel size ", tp_size);
      out_local = out / tp_size;
    } else if (opt.parallelism == DenseParallelism::kRow) {
      QMESH_CHECK(in % tp_size == 0, name, ": in_features ", in,
                  " is not divisible by the tensor-parallel size ", tp_size);
      in_local = in / tp_size;
    }
    check_block_sharding(in, out, tp_size);
    QMESH_CHECK_KIND(ErrorKind::kUnsupported,
                     !(opt.sequence_parallel && context.recipe() == Recipe::kMxfp8), name,
                     ": MXFP8 runs without sequence parallelism (the collective GEMMs take no "
                     "MXFP8 operands); unset DenseOptions::sequence_parallel or use the block "
                     "recipe");
    if (block_sp() && column()) x_full_cast.emplace(context, OperandRole::kInput);
    if (block_sp() && row()) dy_full_cast.emplace(context, OperandRole::kGradOutput);
    // Slice [out0, out0 + out_local) x [in0, in0 + in_local) of the global [out, in] matrix.
    const int64_t out0 = opt.parallelism == DenseParallelism::kColumn ? tp->rank() * out_local : 0;
    const int64_t in0 = opt.parallelism == DenseParallelism::kRow ? tp->rank() * in_local : 0;
    // Drawn on the host and then copied: every device starts from the same bits.
    Tensor init(DType::kFloat32, Shape{out_local, in_local});
    const float stddev = 1.0f / std::sqrt(float(in));
    float* w = init.data_as<float>();
    for (int64_t r = 0; r < out_local; ++r)
      for (int64_t c = 0; c < in_local; ++c)
        w[r * in_local + c] = stddev * counter_normal(seed, uint64_t((out0 + r) * in + in0 + c));
    weight = sharding.shard_parameter(name + ".weight", std::move(init));
    if (opt.bias) {
      Tensor zeros(DType::kFloat32, Shape{out_local});
      std::fill_n(zeros.data_as<float>(), out_local, 0.0f);
      bias = sharding.shard_parameter(name + ".bias", std::move(zeros));
    }
    if (fsdp()) {
      // Forward: this rank's weight shard cast to the recipe's operand (FP8 with the scale
      // from the global amax) and the fp32 bias; backward: forward's cast shard again.
      sharding.add_gather([this](bool forward) {
        if (forward) w_shard = cast_weight_shard();
        return w_shard.stored();
      });
      if (opt.bias)
        sharding.add_gather(
            [this](bool forward) { return forward ? bias.value.view() : TensorView(); });
      if (tile_shards()) {  // the tile scales travel with the codes
        w_scale_slot = sharding.add_gather([this](bool) {
          const TensorView& scales = w_shard.block.scale_inv;
          return TensorView(scales.data, DType::kFloat32, Shape{scales.numel()}, ctx.device());
        });
        const Shape t = block_scale_shape(in_local, out_local, BlockShape::k128x128);
        Tensor zeros(DType::kFloat32, t);  // the padding of the columnwise scales stays 0
        std::fill_n(zeros.data_as<float>(), zeros.numel(), 0.0f);
        w_scales_t = clone(zeros, ctx.device());
      }
      sharding.add_grads(opt.bias ? std::vector<Parameter*>{&weight, &bias}
                                  : std::vector<Parameter*>{&weight});
    }
  }

  bool fsdp() const { return ctx.fsdp().enabled(); }
  // Block scaling or MXFP8: per-block scales.
  bool block_scaled() const {
    return ctx.recipe() == Recipe::kFp8Block || ctx.recipe() == Recipe::kMxfp8;
  }
  // FSDP under block scaling with shards of whole 128-row tile rows (every shard's numel a
  // multiple of 128 · in): each rank block-casts its shard and the FP8 codes and tile scales
  // travel. Otherwise a flat shard cuts the 128x128 tiles: the fp32 shard travels and the
  // gathered weight is block-cast (docs/design/fsdp.md "Block scaling").
  bool tile_shards() const {
    return fsdp() && ctx.recipe() == Recipe::kFp8Block &&
           weight.value.numel() % (kScaleBlock * in_local) == 0;
  }

  // The operand this rank's weight shard is gathered as (FSDP, forward): its cast, or the
  // fp32 shard where block scaling cannot cast it alone.
  GemmOperand cast_weight_shard() {
    const int64_t n = weight.value.numel();
    if (tile_shards())  // [n / in, in]: whole tile rows (zero rows past the weight's end)
      return w_cast.cast(weight.value.view().slice(0, Shape{n / in_local, in_local}), false);
    const TensorView flat(weight.value.data(), DType::kFloat32, Shape{1, n}, ctx.device());
    return block_scaled() ? GemmOperand::plain(flat) : w_cast.cast(flat, false);
  }

  // Under block scaling a shard is whole blocks (1x128 of x and dy, 128x128 tiles of W): then
  // each rank's blocks are the unsharded tensor's and sharded == unsharded. The sharded
  // feature count must be a multiple of 128 (Error naming the sizes otherwise).
  void check_block_sharding(int64_t in, int64_t out, int tp_size) const {
    // (MXFP8's 1x32 blocks: the casts refuse shards that are not multiples of 32.)
    if (ctx.recipe() != Recipe::kFp8Block || tp_size == 1 ||
        options.parallelism == DenseParallelism::kNone)
      return;
    const bool col = options.parallelism == DenseParallelism::kColumn;
    const int64_t local = col ? out_local : in_local;
    QMESH_CHECK(local % kScaleBlock == 0, name, ": the block-scaling recipe shards ",
                col ? "out_features " : "in_features ", col ? out : in, " over tp=", tp_size,
                " into ", local, " features per rank, which cuts a ", kScaleBlock,
                "-wide scaling block (",
                col ? "the weight's 128x128 tiles and dy's 1x128 blocks"
                    : "the weight's 128x128 tiles and x's 1x128 blocks",
                "); choose sizes whose shard is a multiple of ", kScaleBlock);
  }

  // t: an activation (fp32 or bf16) on the context's device.
  void check_activation(const TensorView& t, const std::string& what) const {
    QMESH_CHECK(t.dtype == DType::kFloat32 || t.dtype == DType::kBFloat16, what,
                " must be fp32 or bf16, got ", dtype_name(t.dtype));
    check_device(t, ctx.device(), what);
  }

  // FSDP: gathers this layer's weight for a pass (unless prefetched or kept; the next
  // FsdpOptions::prefetch layers' gathers start meanwhile) and returns the [out, in] operand
  // (FP8: one scale on every rank, so only the codes travel; columnwise copy made here, under
  // block scaling and MXFP8 for backward's dgrad only: forward reads the rowwise copy).
  GemmOperand gathered_weight(bool forward) {
    sharding.acquire(forward);
    const TensorView w_full = sharding.gathered(0);
    const TensorView w(w_full.data, w_full.dtype, Shape{out_local, in_local}, ctx.device());
    if (tile_shards()) return gathered_block_weight(w, !forward);
    if (block_scaled()) return w_cast.cast(w, !forward);
    if (!w_shard.is_quantized()) return GemmOperand::plain(w);
    QuantizedTensorView q = w_shard.quantized;
    q.data = w;
    q.data_t = TensorView();
    if (columnwise()) {
      q.data_t = w_full_t.ensure(w.dtype, Shape{in_local, out_local}, ctx.device(), ctx.stream());
      transpose(q.data, q.data_t, ctx.stream());
    }
    return GemmOperand::fp8(q);
  }

  // The gathered tile codes `w` [out, in] with their scales (the first ceil(out/128) rows of
  // the gathered tile-scale rows, the shards' in order), and if `columnwise` the columnwise
  // copy: the codes transposed, the tile scales transposed into
  // [ceil(in/128), round_up(ceil(out/128), 4)]. Bitwise the block cast of the whole weight (the
  // shards' tiles are its tiles; zero rows past its end change no tile's amax).
  GemmOperand gathered_block_weight(const TensorView& w, bool columnwise) {
    const Device dev = ctx.device();
    const Stream stream = ctx.stream();
    BlockQuantizedTensorView q;
    q.block = BlockShape::k128x128;
    q.data = w;
    const Shape scales = block_scale_shape(out_local, in_local, BlockShape::k128x128);
    q.scale_inv = TensorView(sharding.gathered(w_scale_slot).data, DType::kFloat32, scales, dev);
    if (!columnwise) return GemmOperand::fp8_block(q);
    q.data_t = w_full_t.ensure(w.dtype, Shape{in_local, out_local}, dev, stream);
    transpose(q.data, q.data_t, stream);
    const TensorView t =
        w_scales_tmp.ensure(DType::kFloat32, Shape{scales.cols(), scales.rows()}, dev, stream);
    transpose(q.scale_inv, t, stream);
    q.scale_inv_t = w_scales_t;
    constexpr size_t f = sizeof(float);
    const int64_t col_blocks = w_scales_t.shape().rows();
    copy_rows_async(w_scales_t.data(), size_t(w_scales_t.shape().cols()) * f, dev, t.data,
                    size_t(scales.rows()) * f, dev, size_t(scales.rows()) * f, size_t(col_blocks),
                    stream);
    return GemmOperand::fp8_block(q);
  }

  // Frees the columnwise copy of the gathered weight (FSDP, after its pass).
  void release_gathered_copies() {
    w_full_t.reset();
    w_scales_tmp.reset();
  }

  // The fp32 bias of the forward pass: the parameter, or under FSDP its gathered form.
  TensorView bias_value() {
    if (!fsdp()) return bias.value;
    return TensorView(sharding.gathered(1).data, DType::kFloat32, Shape{out_local}, ctx.device());
  }

  // Where backward writes the full weight / bias gradient: the parameter's grad, or under
  // FSDP a buffer that FsdpLayer::reduce_grads() reduce-scatters into the shard.
  TensorView weight_grad() {
    if (!fsdp()) return weight.grad;
    return sharding.full_grad(weight, Shape{out_local, in_local});
  }
  TensorView bias_grad_target() {
    if (!fsdp()) return bias.grad;
    return sharding.full_grad(bias, Shape{out_local});
  }

  bool column() const { return options.parallelism == DenseParallelism::kColumn; }
  bool row() const { return options.parallelism == DenseParallelism::kRow; }
  bool sp() const { return options.sequence_parallel; }
  // GELU on the output in this layer's forward (else a kProducer leaves it to its consumer).
  bool gelu_here() const {
    return options.activation == DenseActivation::kGelu &&
           options.gelu_split != DenseGeluSplit::kProducer;
  }
  // Whether a GEMM that reads an FP8 operand transposed needs its columnwise copy: on CUDA (the
  // FP8 GEMM is TN-only) and, under block scaling and MXFP8, on every backend.
  bool columnwise() const { return x_in.device.is_cuda() || block_scaled(); }
  // The same for a sequence-parallel shard (column: x, row: dy). Under block scaling its
  // columnwise copy is never read: the ring moves the rowwise codes and scales, and wgrad's
  // copy is cast from the gathered high-precision tensor.
  bool shard_columnwise() const { return columnwise() && !block_scaled(); }

  TensorView forward(const TensorView& x, const TensorView& residual,
                     const CastFusion& fusion = {}) {
    check_activation(x, name + " input");
    QMESH_CHECK(!column() || x.dtype == DType::kFloat32, name,
                ": a column-parallel layer takes an fp32 input (its gradient is reduced over tp "
                "in fp32), got ",
                dtype_name(x.dtype));
    QMESH_CHECK(x.shape.cols() == in_local, name, ": input must have ", in_local,
                " features (last dimension), got shape ", x.shape.str());
    x_in = x;
    // Column parallel with sequence parallelism gathers the sequence shards [T/tp, in] ->
    // [T, in] inside the collective GEMM, as cast operands (FP8 codes, bf16).
    tokens = column() && sp() ? x.shape.rows() * tp->size() : x.shape.rows();
    QMESH_CHECK(!(row() && sp()) || tokens % tp->size() == 0, name, ": ", tokens,
                " tokens cannot be reduce-scattered over tp=", tp->size());
    GemmArgs args;
    args.a =
        x_cast.cast(x, column() && sp() ? shard_columnwise() : columnwise(), input_fusion(fusion));
    GemmOperand x_gathered;
    if (column() && sp()) {
      // Block scaling: the ring gathers the rowwise codes and scales for this GEMM only; wgrad's
      // columnwise copy is cast in backward from the gathered input (x_full_cast).
      x_gathered = gather_buffer().get(args.a, tokens, shard_columnwise());
      last_x = regather() || block_scaled() ? args.a : x_gathered;
    } else {
      last_x = args.a;
    }
    last_w = fsdp() ? gathered_weight(true) : w_cast.cast(weight.value, columnwise());
    args.b = last_w;
    args.trans_b = GemmTranspose::kYes;  // y = x · Wᵀ
    const int64_t out_rows = row() && sp() ? tokens / tp->size() : tokens;
    const TensorView out =
        ensure_tensor(y, options.output_dtype, with_rows(out_rows, out_local), x.device);
    args.d = out;
    if (options.bias && !row()) {
      args.bias = epilogue_bias(is_fp8(args.a), out.dtype);
      args.epilogue = GemmEpilogue::kBias;
    }
    if (gelu_here()) {  // saves the pre-activation
      args.epilogue = GemmEpilogue::kBiasGeluAux;
      args.aux = ensure_tensor(pre_activation, out.dtype, out.shape, x.device);
    }
    // The block-scaled GEMM accumulates in fp32 (Float8BlockScaling::fp8_gemm_fprop).
    args.accumulation = block_scaled() ? GemmAccumulation::kSplit : GemmAccumulation::kFast;
    args.emulate_microscaled = ctx.mxfp8_scaling().emulate;
    check_residual(residual, out);
    const bool residual_fused = residual_in_gemm(args, residual);
    if (residual_fused) {  // D = residual, then D += x · Wᵀ + b
      copy_bytes_async(out.data, out.device, residual.data, residual.device, out.nbytes(),
                       ctx.stream());
      gemm(args, ctx.stream());
      ran_epilogue = options.bias ? DenseEpilogue::kFused : DenseEpilogue::kNone;
    } else if (column() && sp()) {
      gemm_with_epilogue(args, x.shape.rows(), [&](const GemmArgs& a) {
        all_gather_gemm(*tp, a, rowwise(x_gathered), overlap, streams());
      });
      // With kRegather backward gathers again (and fills the copy then).
      if (!regather()) fill_columnwise(x_gathered);
    } else if (row() && sp()) {  // partial products reduce-scattered to [T/tp, out]
      gemm_reduce_scatter(*tp, args, overlap, streams());
    } else {
      gemm_with_epilogue(args, tokens, [&](const GemmArgs& a) { gemm(a, ctx.stream()); });
      if (row() && tp->size() > 1)
        all_reduce_in_stream_order(*tp, out, ReduceOp::kSum, ctx.stream());
    }
    // Row parallel: the partial products are summed over tp; add the (replicated) bias.
    if (row() && !residual_fused) {
      if (options.bias) add_bias(out, bias_value(), ctx.stream());
      ran_epilogue = options.bias ? DenseEpilogue::kSeparate : DenseEpilogue::kNone;
    }
    if (!residual.empty() && !residual_fused) add(residual, out, out, ctx.stream());
    if (fsdp() && !ctx.fsdp_options().keep_gathered) {
      sharding.release();
      release_gathered_copies();
    }
    return out;
  }

  TensorView backward(const TensorView& dy_in) {
    QMESH_CHECK(!x_in.empty(), name, ": backward called before forward");
    check_activation(dy_in, name + " output gradient");
    QMESH_CHECK(options.activation == DenseActivation::kNone || dy_in.dtype == y.dtype(), name,
                ": GELU's backward reads the ", dtype_name(y.dtype()),
                " pre-activation with the output gradient; pass a gradient of that dtype, got ",
                dtype_name(dy_in.dtype));
    const Shape x_shape = with_rows(tokens, in_local);  // x as the GEMMs saw it
    if (fsdp()) last_w = gathered_weight(false);
    const TensorView dx_out = backward_unsharded(dy_in, x_shape);
    if (fsdp()) {  // the reduce-scatter stays in flight while the earlier layers run backward
      release_gathered_copies();
      sharding.reduce_grads();
    }
    return dx_out;
  }

  // backward() with the weights gathered; leaves the full gradients to reduce_grads().
  TensorView backward_unsharded(const TensorView& dy_in, const Shape& x_shape) {
    if (row() && sp()) return backward_row_sp(dy_in, x_shape);
    return backward_unsharded_dy(dy_in, x_shape);
  }

  // backward_unsharded() with dy [T, out] whole (row parallel: gathered).
  TensorView backward_unsharded_dy(const TensorView& dy_in, const Shape& x_shape) {
    check_shape(dy_in, Shape{tokens, out_local}, name + " output gradient");
    // Through GELU (dy · gelu'(pre), pre saved by forward: the output itself for a kProducer)
    // and the bias gradient, in dy's cast.
    CastFusion fusion;
    if (options.activation == DenseActivation::kGelu) {
      fusion.kind = CastFusion::Kind::kDgelu;
      fusion.pre = gelu_here() ? pre_activation.view() : y.view();
    }
    if (options.bias) fusion.dbias = bias_grad_target();
    const GemmOperand dy_op = dy_cast.cast(dy_in, columnwise(), fusion);
    // dgrad: dx [T, in] = dy · W.
    GemmArgs dgrad = dgrad_args(dy_op);
    if (column() && sp()) {  // partial dx reduce-scattered to this rank's [T/tp, in]
      // Bulk overlap: wgrad's input, when not kept, is all-gathered again during dgrad (block
      // scaling: always, in high precision, for the cast of its columnwise copy).
      GemmOperand x_full = last_x;
      std::optional<OperandGather> regathered;
      if (block_scaled()) {
        x_full = GemmOperand::plain(gathered_buffer(x_in));
        regathered.emplace(*tp, GemmOperand::plain(x_in), x_full, streams());
      } else if (regather()) {
        x_full = gather_buffer().get(last_x, tokens, columnwise());
        regathered.emplace(*tp, rowwise(last_x), rowwise(x_full), streams());
      }
      dgrad.d = ensure_tensor(dx, x_in.dtype, x_in.shape, x_in.device);
      gemm_reduce_scatter(*tp, dgrad, overlap, streams());
      if (regathered) {
        regathered->finish();
        if (block_scaled())
          x_full = x_full_cast->cast(x_full.tensor, true, input_fusion());
        else
          fill_columnwise(x_full);
      }
      run_wgrad(dy_op, x_full);
      return dgrad.d;
    }
    run_wgrad(dy_op, last_x);
    dgrad.d = ensure_tensor(dx, x_in.dtype, x_shape, x_in.device);
    gemm(dgrad, ctx.stream());
    // Column parallel: every tp rank holds a partial dx over the full input features.
    if (column() && tp->size() > 1)
      all_reduce_in_stream_order(*tp, dgrad.d, ReduceOp::kSum, ctx.stream());
    return dgrad.d;
  }

  // Row parallel with sequence parallelism: dy arrives as this rank's [T/tp, out] shard. The
  // cast shard is gathered inside the dgrad GEMM (dx = gather(dy) · W); wgrad then reuses
  // the gathered operand (block scaling: the high-precision dy, gathered beside the dgrad
  // GEMM, cast with its columnwise copy, whose 1x128 blocks span the ranks' shards). The
  // replicated bias's gradient sums every rank's column sums in rank order (the same bits on
  // every rank and for every schedule).
  TensorView backward_row_sp(const TensorView& dy_in, const Shape& x_shape) {
    const int n = tp->size();
    check_shape(dy_in, Shape{tokens / n, out_local}, name + " output gradient");
    CastFusion fusion;  // this rank's column sums, summed in dy's cast
    if (options.bias) fusion.dbias = bias_grad_target();
    GemmArgs dgrad = dgrad_args(dy_cast.cast(dy_in, shard_columnwise(), fusion));
    if (options.bias) {
      const TensorView sums =
          ensure_tensor(bias_sums, DType::kFloat32, Shape{n, out_local}, dy_in.device);
      all_gather_in_stream_order(*tp, fusion.dbias, sums, ctx.stream());
      bias_grad(sums, fusion.dbias, ctx.stream());  // rank 0's sums plus the others' in rank order
    }
    const GemmOperand dy_gathered = dy_gather.get(dgrad.a, tokens, shard_columnwise());
    std::optional<OperandGather> dy_full;
    if (block_scaled())
      dy_full.emplace(*tp, GemmOperand::plain(dy_in), GemmOperand::plain(gathered_buffer(dy_in)),
                      streams());
    dgrad.d = ensure_tensor(dx, x_in.dtype, x_shape, x_in.device);
    all_gather_gemm(*tp, dgrad, rowwise(dy_gathered), overlap, streams());
    if (dy_full) {
      dy_full->finish();
      run_wgrad(dy_full_cast->cast(gathered.view(), true), last_x);
      return dgrad.d;
    }
    fill_columnwise(dy_gathered);
    run_wgrad(dy_gathered, last_x);
    return dgrad.d;
  }

  // A residual added to the output: fp32, shaped like it, on the context's device, and not
  // with GELU (which would apply before it).
  void check_residual(const TensorView& residual, const TensorView& out) const {
    if (residual.empty()) return;
    QMESH_CHECK(options.activation == DenseActivation::kNone, name,
                ": a residual is added to the output of a layer without GELU");
    QMESH_CHECK(out.dtype == DType::kFloat32, name,
                ": a residual is added to an fp32 output; set output_dtype fp32");
    check_dtype(residual, DType::kFloat32, name + " residual");
    check_device(residual, ctx.device(), name + " residual");
    check_shape(residual, out.shape, name + " residual");
  }

  // Turns `args` into y = residual + x · Wᵀ + b in one GEMM where it can: D's old value is the
  // residual (GemmOutputMode::kAccumulate) and the bias is in the epilogue. Only without a
  // reduction over tp (tp = 1, no sequence parallelism: a partial sum is reduced before the
  // residual is added) and where the backend offers it (asked once per token count); false
  // otherwise, `args` unchanged.
  bool residual_in_gemm(GemmArgs& args, const TensorView& residual) {
    if (residual.empty() || sp() || tp->size() != 1) return false;
    GemmArgs fused = args;
    fused.output = GemmOutputMode::kAccumulate;
    if (options.bias) {
      fused.bias = epilogue_bias(is_fp8(fused.a), fused.d.dtype);
      fused.epilogue = GemmEpilogue::kBias;
    }
    if (residual_checked_for != tokens) {
      residual_fusable = Gemm::can_implement(fused).ok();
      residual_checked_for = tokens;
    }
    if (residual_fusable) args = fused;
    return residual_fusable;
  }

  // The bias as the forward GEMM's epilogue reads it (detail::forward_bias_dtype): the fp32
  // bias (bias_value(): under FSDP the gathered one), or a bf16 copy of it made now for FP8
  // operands or a bf16 output.
  TensorView epilogue_bias(bool fp8_operands, DType out_dtype) {
    const TensorView b32 = bias_value();
    if (detail::forward_bias_dtype(fp8_operands, out_dtype) == DType::kFloat32) return b32;
    const TensorView b16 = ensure_tensor(bias_bf16, DType::kBFloat16, b32.shape, b32.device);
    convert_to_bf16(b32, b16, ctx.stream());
    return b16;
  }

  // The forward GEMM, run by `run` (a plain GEMM, or the all-gather GEMM whose chunks have
  // `a_rows` rows), with the epilogue that detail::choose_forward_epilogue picks for these
  // operands; the backend is asked once per token count, with the shapes of one GEMM call.
  // The separate passes add the fp32 bias.
  void gemm_with_epilogue(GemmArgs args, int64_t a_rows,
                          const std::function<void(const GemmArgs&)>& run) {
    if (epilogue_checked_for != tokens) {
      GemmArgs probe = args;
      probe.d = args.d.rows(0, a_rows);
      if (!args.aux.empty()) probe.aux = args.aux.rows(0, a_rows);
      epilogue = detail::choose_forward_epilogue(
          probe, [](const GemmArgs& a) { return Gemm::can_implement(a).ok(); });
      epilogue_checked_for = tokens;
    }
    const bool with_gelu = args.epilogue == GemmEpilogue::kBiasGeluAux;
    const TensorView out = args.d;
    ran_epilogue = epilogue;
    switch (epilogue) {
      case DenseEpilogue::kNone:
      case DenseEpilogue::kFused:
        run(args);
        return;
      case DenseEpilogue::kBiasFused:  // GELU only: the bias is in the pre-activation
        run(detail::bias_only(args));
        gelu(args.aux, out, ctx.stream());
        return;
      case DenseEpilogue::kSeparate:
        if (with_gelu) args.d = args.aux;  // the pre-activation, kept for backward
        args.epilogue = GemmEpilogue::kNone;
        args.bias = {};
        args.aux = {};
        run(args);
        add_bias(args.d, bias_value(), ctx.stream());
        if (with_gelu) gelu(args.d, out, ctx.stream());
        return;
    }
  }

  // Sequence parallelism under block scaling: the rings gather the shards' rowwise codes and
  // scales for the GEMMs; the high-precision shards (x for column, dy for row) are gathered
  // too, beside the backward collective GEMM, and cast for wgrad's columnwise copies.
  bool block_sp() const { return block_scaled() && sp(); }
  // The layer's [T, cols] buffer for the all-gather of a [T/tp, cols] shard.
  TensorView gathered_buffer(const TensorView& shard) {
    return ensure_tensor(gathered, shard.dtype,
                         Shape{shard.shape.rows() * tp->size(), shard.shape.cols()}, shard.device);
  }
  // What the input's cast applies first: `fusion` (forward_fused), or GELU for a
  // DenseGeluSplit::kConsumer. (Block scaling recasts the gathered input in backward with
  // input_fusion(): a LayerNorm runs in a cast under per-tensor FP8 only.)
  CastFusion input_fusion(CastFusion fusion = {}) const {
    if (options.gelu_split == DenseGeluSplit::kConsumer) fusion.kind = CastFusion::Kind::kGelu;
    return fusion;
  }

  // An FP8 operand, per-tensor or block-scaled.
  static bool is_fp8(const GemmOperand& op) { return op.is_quantized() || op.is_block_scaled(); }

  // The streams of the collective GEMMs (ignored on the host).
  CollectiveGemmStreams streams() const { return {ctx.stream(), ctx.placement().comm_stream}; }
  // A gathered operand as the collective GEMM fills it: the rowwise codes (and block scales)
  // only.
  static GemmOperand rowwise(GemmOperand op) {
    if (op.is_quantized()) op.quantized.data_t = TensorView();
    op.block.data_t = TensorView();
    op.block.scale_inv_t = TensorView();
    return op;
  }
  // The columnwise copy of a gathered FP8 operand, where the CUDA GEMMs need it for wgrad.
  void fill_columnwise(const GemmOperand& op) {
    if (op.is_quantized() && op.quantized.has_columnwise())
      transpose(op.quantized.data, op.quantized.data_t, ctx.stream());
  }

  // wgrad: dW [out, in] = dyᵀ · x, with x as forward cast it (gathered under column SP).
  void run_wgrad(const GemmOperand& dy_op, const GemmOperand& x_op) {
    GemmArgs wgrad;
    wgrad.a = dy_op;
    wgrad.trans_a = GemmTranspose::kYes;
    wgrad.b = x_op;
    wgrad.trans_b = GemmTranspose::kNo;
    wgrad.d = weight_grad();
    wgrad.accumulation = GemmAccumulation::kSplit;
    wgrad.emulate_microscaled = ctx.mxfp8_scaling().emulate;
    gemm(wgrad, ctx.stream());
  }

  bool regather() const { return options.gathered_input == GatheredInput::kRegather; }
  // Where the column-parallel SP input is gathered: this layer's own buffer, or with
  // kRegather the context's shared one.
  GatherBuffer& gather_buffer() { return regather() ? ctx.shared_gather_buffer() : x_gather; }

  // dgrad: dx = dy · W (D to be set by the caller).
  GemmArgs dgrad_args(const GemmOperand& dy_op) const {
    GemmArgs dgrad;
    dgrad.a = dy_op;
    dgrad.b = last_w;
    dgrad.trans_b = GemmTranspose::kNo;
    dgrad.accumulation = GemmAccumulation::kSplit;
    dgrad.emulate_microscaled = ctx.mxfp8_scaling().emulate;
    return dgrad;
  }

  std::string name;
  DenseOptions options;
  LayerContext& ctx;
  std::shared_ptr<Communicator> tp;
  Overlap overlap;  // the collective-GEMM schedule under sequence parallelism
  int64_t in_local = 0, out_local = 0;
  Parameter weight, bias;
  OperandCast x_cast, w_cast, dy_cast;
  // Block scaling with sequence parallelism: the casts of the gathered x (column) and dy
  // (row), whose columnwise copies wgrad reads.
  std::optional<OperandCast> x_full_cast, dy_full_cast;
  GatherBuffer x_gather, dy_gather;  // gathered operands (x: column SP, dy: row SP)
  GemmOperand last_x, last_w;  // forward's operands, reused by backward (x: see GatheredInput)
  TensorView x_in;
  int64_t tokens = 0;  // rows of the forward GEMM (the gathered sequence under column SP)
  int64_t epilogue_checked_for = -1;                  // the token count `epilogue` was chosen for
  DenseEpilogue epilogue = DenseEpilogue::kNone;      // what the forward GEMM runs
  DenseEpilogue ran_epilogue = DenseEpilogue::kNone;  // what the last forward ran
  int64_t residual_checked_for = -1;  // the token count `residual_fusable` was asked for
  bool residual_fusable = false;      // the residual and bias fit in the forward GEMM
  Tensor y, pre_activation, bias_sums, dx, bias_bf16;
  Tensor gathered;             // the gathered high-precision x or dy (block_sp())
  int64_t backward_step = -1;  // ctx.steps() when backward last ran (-1: never)
  // FSDP: forward's cast shard and the gathered weight's columnwise copy; the gathers
  // (slot 0: the weight's codes / bf16 / fp32, flat and padded; slot 1: the fp32 bias) and the
  // gradient reduce-scatters. Declared last: destroyed first (it completes a reduction into
  // weight.grad and bias.grad still in flight).
  GemmOperand w_shard;
  StreamOrderedTensor w_full_t;
  // Block scaling with tile_shards(): the slot of the tile scales, the transposed gathered
  // scales, and the columnwise copy's scales (zero padding kept).
  int w_scale_slot = -1;
  StreamOrderedTensor w_scales_tmp;
  Tensor w_scales_t;
  FsdpLayer sharding;
};

Dense::Dense(std::string name, int64_t in_features, int64_t out_features, DenseOptions options,
             LayerContext& ctx, uint64_t seed)
    : impl_(
          std::make_unique<Impl>(std::move(name), in_features, out_features, options, ctx, seed)) {}
Dense::~Dense() = default;
Dense::Dense(Dense&&) noexcept = default;

TensorView Dense::forward(const TensorView& x, const TensorView& residual) {
  impl_->ctx.check_forward(impl_->backward_step, impl_->name);
  return impl_->forward(x, residual);
}
TensorView Dense::forward_fused(const TensorView& x, const CastFusion& input_fusion) {
  impl_->ctx.check_forward(impl_->backward_step, impl_->name);
  return impl_->forward(x, {}, input_fusion);
}
TensorView Dense::backward(const TensorView& dy) {
  const TensorView dx = impl_->backward(dy);
  impl_->backward_step = impl_->ctx.steps();
  return dx;
}

std::vector<Parameter*> Dense::parameters() {
  std::vector<Parameter*> out{&impl_->weight};
  if (impl_->options.bias) out.push_back(&impl_->bias);
  return out;
}
Parameter& Dense::weight() { return impl_->weight; }
const DenseOptions& Dense::options() const { return impl_->options; }
DenseEpilogue Dense::forward_epilogue() const { return impl_->ran_epilogue; }

const char* dense_epilogue_name(DenseEpilogue e) {
  switch (e) {
    case DenseEpilogue::kNone:
      return "none";
    case DenseEpilogue::kFused:
      return "fused";
    case DenseEpilogue::kBiasFused:
      return "bias_fused";
    case DenseEpilogue::kSeparate:
      return "separate";
  }
  QMESH_THROW("dense_epilogue_name: unknown DenseEpilogue value ", int(e));
}

}  // namespace qmesh
