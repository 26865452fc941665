#include "qmesh/layers/layer_norm.h"

#include <algorithm>

#include "layers/activation_buffer.h"
#include "layers/fsdp_layer.h"
#include "layers/operand_cast.h"
#include "qmesh/comm/stream_ordered.h"
#include "qmesh/error.h"
#include "qmesh/ops/layer_norm.h"

namespace qmesh {

namespace {
Tensor filled(int64_t n, float value) {
  Tensor host(DType::kFloat32, Shape{n});
  std::fill_n(host.data_as<float>(), n, value);
  return host;
}
}  // namespace

struct LayerNorm::Impl {
  Impl(std::string name, int64_t hidden_in, float eps_in, LayerContext& context,
       bool sequence_parallel)
      : hidden(hidden_in),
        eps(eps_in),
        placement(context.placement()),
        ctx(context),
        sp(sequence_parallel),
        tp(context.mesh().role(context.mesh().resource().tp)),
        sharding(context) {
    QMESH_CHECK(hidden >= 1, name, ": hidden size must be >= 1, got ", hidden);
    QMESH_CHECK(eps > 0, name, ": eps must be > 0, got ", eps);
    gamma = sharding.shard_parameter(name + ".gamma", filled(hidden, 1.0f));
    beta = sharding.shard_parameter(name + ".beta", filled(hidden, 0.0f));
    if (fsdp()) {  // forward gathers gamma and beta; backward gamma only
      sharding.add_gather([this](bool) { return gamma.value.view(); });
      sharding.add_gather(
          [this](bool forward) { return forward ? beta.value.view() : TensorView(); });
      sharding.add_grads({&gamma, &beta});
    }
  }

  bool fsdp() const { return ctx.fsdp().enabled(); }
  // gamma or beta as forward and backward read it: the parameter, or under FSDP the first
  // `hidden` elements of its gathered (padded) slot.
  TensorView value(const Parameter& p, int slot) const {
    if (!fsdp()) return p.value;
    return TensorView(sharding.gathered(slot).data, DType::kFloat32, Shape{hidden},
                      placement.device);
  }
  // Where backward writes a gradient: the parameter's grad, or under FSDP the full gradient
  // that FsdpLayer::reduce_grads() reduce-scatters into it.
  TensorView grad_target(Parameter& p) {
    return fsdp() ? sharding.full_grad(p, Shape{hidden}) : p.grad.view();
  }

  // Checks x and keeps it for backward; sizes mean and rstd.
  void start_forward(const TensorView& x_in) {
    const Device device = placement.device;
    check_dtype(x_in, DType::kFloat32, "LayerNorm input");
    check_device(x_in, device, "LayerNorm input");
    QMESH_CHECK(x_in.shape.cols() == hidden, gamma.name, ": input's last dimension must be ",
                hidden, ", got shape ", x_in.shape.str());
    const int64_t rows = x_in.shape.rows();
    x = x_in;
    ensure_tensor(mean, DType::kFloat32, Shape{rows}, device);
    ensure_tensor(rstd, DType::kFloat32, Shape{rows}, device);
  }

  TensorView forward(const TensorView& x_in) {
    start_forward(x_in);
    if (fsdp()) sharding.acquire(true);
    layer_norm_forward(x_in, value(gamma, 0), value(beta, 1), eps,
                       ensure_tensor(y, DType::kFloat32, x_in.shape, placement.device), mean, rstd,
                       placement.stream);
    if (fsdp() && !ctx.fsdp_options().keep_gathered) sharding.release();
    return y.view();
  }

  bool fuses_into_cast() const {
    return (ctx.recipe() == Recipe::kFp8Delayed || ctx.recipe() == Recipe::kFp8Current) && !fsdp();
  }

  CastFusion fused_forward(const TensorView& x_in) {
    QMESH_CHECK(fuses_into_cast(), gamma.name,
                ": the LayerNorm runs in the next cast only under per-tensor FP8 without FSDP");
    start_forward(x_in);
    CastFusion fusion;
    fusion.kind = CastFusion::Kind::kLayerNorm;
    fusion.gamma = gamma.value;
    fusion.beta = beta.value;
    fusion.eps = eps;
    fusion.mean = mean;
    fusion.rstd = rstd;
    return fusion;
  }

  TensorView backward(const TensorView& dy, const TensorView& residual) {
    QMESH_CHECK(!x.empty(), gamma.name, ": backward called before forward");
    check_dtype(dy, DType::kFloat32, "LayerNorm output gradient");
    check_device(dy, placement.device, "LayerNorm output gradient");
    check_shape(dy, x.shape, "LayerNorm output gradient");
    if (fsdp()) sharding.acquire(false);
    const TensorView dgamma = grad_target(gamma), dbeta = grad_target(beta);
    layer_norm_backward(dy, x, value(gamma, 0), mean, rstd,
                        ensure_tensor(dx, DType::kFloat32, x.shape, placement.device), dgamma,
                        dbeta, placement.stream, residual);
    if (sp)  // partial sums over the tp ranks' tokens
      for (const TensorView& g : {dgamma, dbeta})
        all_reduce_in_stream_order(*tp, g, ReduceOp::kSum, placement.stream);
    sharding.reduce_grads();  // under FSDP
    return dx.view();
  }

  int64_t hidden;
  float eps;
  Placement placement;
  LayerContext& ctx;
  bool sp;
  std::shared_ptr<Communicator> tp;
  Parameter gamma, beta;
  TensorView x;
  Tensor y, dx, mean, rstd;
  // Under FSDP: the gathers of gamma and beta and their gradient reduce-scatters. Declared
  // last: destroyed first (it completes a reduction into the grads still in flight).
  FsdpLayer sharding;
};

LayerNorm::LayerNorm(std::string name, int64_t hidden, float eps, LayerContext& ctx,
                     bool sequence_parallel)
    : impl_(std::make_unique<Impl>(std::move(name), hidden, eps, ctx, sequence_parallel)) {}
LayerNorm::~LayerNorm() = default;
LayerNorm::LayerNorm(LayerNorm&&) noexcept = default;

TensorView LayerNorm::forward(const TensorView& x) { return impl_->forward(x); }
bool LayerNorm::fuses_into_cast() const { return impl_->fuses_into_cast(); }
CastFusion LayerNorm::fused_forward(const TensorView& x) { return impl_->fused_forward(x); }
TensorView LayerNorm::backward(const TensorView& dy, const TensorView& residual) {
  return impl_->backward(dy, residual);
}
std::vector<Parameter*> LayerNorm::parameters() { return {&impl_->gamma, &impl_->beta}; }
int64_t LayerNorm::hidden() const { return impl_->hidden; }

}  // namespace qmesh
