#include "qmesh/layers/layer_norm.h"

#include <algorithm>

#include "layers/activation_buffer.h"
#include "layers/fsdp_layer.h"
#include "layers/parameter_init.h"
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
  Impl(std::string name, int64_t hidden_in, float eps_in, Placement place, LayerContext* context,
       bool sequence_parallel)
      : hidden(hidden_in), eps(eps_in), placement(place), ctx(context), sp(sequence_parallel) {
    QMESH_CHECK(hidden >= 1, name, ": hidden size must be >= 1, got ", hidden);
    QMESH_CHECK(eps > 0, name, ": eps must be > 0, got ", eps);
    if (context) {
      tp = context->mesh().role(context->mesh().resource().tp);
      if (context->fsdp().enabled()) sharding = std::make_unique<FsdpLayer>(*context);
    }
    gamma = make(name + ".gamma", filled(hidden, 1.0f));
    beta = make(name + ".beta", filled(hidden, 0.0f));
    if (sharding) {  // forward gathers gamma and beta; backward gamma only
      sharding->add_gather([this](bool) { return gamma.value.view(); });
      sharding->add_gather(
          [this](bool forward) { return forward ? beta.value.view() : TensorView(); });
      sharding->add_grads({&gamma, &beta});
    }
  }

  Parameter make(std::string name, Tensor init) const {
    if (sharding) return sharding->shard_parameter(std::move(name), std::move(init));
    return make_parameter(std::move(name), std::move(init), placement.device);
  }
  // The first `hidden` elements of a gathered (padded) slot.
  TensorView gathered(int slot) const {
    return TensorView(sharding->gathered(slot).data, DType::kFloat32, Shape{hidden},
                      placement.device);
  }

  TensorView forward(const TensorView& x_in) {
    const Device device = placement.device;
    check_dtype(x_in, DType::kFloat32, "LayerNorm input");
    check_device(x_in, device, "LayerNorm input");
    QMESH_CHECK(x_in.shape.cols() == hidden, gamma.name, ": input's last dimension must be ",
                hidden, ", got shape ", x_in.shape.str());
    const int64_t rows = x_in.shape.rows();
    x = x_in;
    if (sharding) sharding->acquire(true);
    layer_norm_forward(x_in, sharding ? gathered(0) : gamma.value.view(),
                       sharding ? gathered(1) : beta.value.view(), eps,
                       ensure_tensor(y, DType::kFloat32, x_in.shape, device),
                       ensure_tensor(mean, DType::kFloat32, Shape{rows}, device),
                       ensure_tensor(rstd, DType::kFloat32, Shape{rows}, device), placement.stream);
    if (sharding && !ctx->fsdp_options().keep_gathered) sharding->release();
    return y.view();
  }

  TensorView backward(const TensorView& dy) {
    QMESH_CHECK(!x.empty(), gamma.name, ": backward called before forward");
    check_dtype(dy, DType::kFloat32, "LayerNorm output gradient");
    check_device(dy, placement.device, "LayerNorm output gradient");
    check_shape(dy, x.shape, "LayerNorm output gradient");
    if (sharding) sharding->acquire(false);
    const TensorView dgamma =
        sharding ? sharding->full_grad(gamma, Shape{hidden}) : gamma.grad.view();
    const TensorView dbeta = sharding ? sharding->full_grad(beta, Shape{hidden}) : beta.grad.view();
    layer_norm_backward(dy, x, sharding ? gathered(0) : gamma.value.view(), mean, rstd,
                        ensure_tensor(dx, DType::kFloat32, x.shape, placement.device), dgamma,
                        dbeta, placement.stream);
    if (sp)  // partial sums over the tp ranks' tokens
      for (const TensorView& g : {dgamma, dbeta})
        all_reduce_in_stream_order(*tp, g, ReduceOp::kSum, placement.stream);
    if (sharding) sharding->reduce_grads();
    return dx.view();
  }

  int64_t hidden;
  float eps;
  Placement placement;
  LayerContext* ctx;  // null for a standalone LayerNorm
  bool sp;
  std::shared_ptr<Communicator> tp;  // with a context
  Parameter gamma, beta;
  TensorView x;
  Tensor y, dx, mean, rstd;
  // Under FSDP: the gathers of gamma and beta and their gradient reduce-scatters. Declared
  // last: destroyed first (it completes a reduction into the grads still in flight).
  std::unique_ptr<FsdpLayer> sharding;
};

LayerNorm::LayerNorm(std::string name, int64_t hidden, float eps, Placement placement)
    : impl_(std::make_unique<Impl>(std::move(name), hidden, eps, placement, nullptr, false)) {}
LayerNorm::LayerNorm(std::string name, int64_t hidden, float eps, LayerContext& ctx,
                     bool sequence_parallel)
    : impl_(std::make_unique<Impl>(std::move(name), hidden, eps, ctx.placement(), &ctx,
                                   sequence_parallel)) {}
LayerNorm::~LayerNorm() = default;
LayerNorm::LayerNorm(LayerNorm&&) noexcept = default;

TensorView LayerNorm::forward(const TensorView& x) { return impl_->forward(x); }
TensorView LayerNorm::backward(const TensorView& dy) { return impl_->backward(dy); }
std::vector<Parameter*> LayerNorm::parameters() { return {&impl_->gamma, &impl_->beta}; }
int64_t LayerNorm::hidden() const { return impl_->hidden; }

}  // namespace qmesh
