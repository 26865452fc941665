#include "layers/fsdp_layer.h"

#include <algorithm>

#include "layers/activation_buffer.h"
#include "layers/fsdp_prefetch.h"
#include "layers/parameter_init.h"
#include "qmesh/copy.h"
#include "qmesh/error.h"
#include "qmesh/logging.h"

namespace qmesh {

// The reduce-scatters run on `comm`; finish() orders the compute stream's later work (the
// optimizer) after them, and releases the full gradients they read in comm's order.
struct FsdpLayer::PendingReduction {
  std::vector<WorkHandle> works;
  std::vector<StreamOrderedTensor> buffers;
  Device device;
  Stream compute, comm;
  void finish() {
    for (WorkHandle& work : works)
      if (work) work->wait();
    works.clear();
    order_after(device, compute, comm);
    for (StreamOrderedTensor& buffer : buffers) buffer.reset(comm);
    buffers.clear();
  }
};

FsdpLayer::FsdpLayer(LayerContext& ctx) : ctx_(ctx) {
  if (enabled())
    prefetch_index_ = ctx.fsdp_prefetch().add([this](bool forward) { start(forward); });
}

FsdpLayer::~FsdpLayer() {
  if (prefetch_index_ < 0) return;
  ctx_.fsdp_prefetch().remove(prefetch_index_);
  // A reduction still in flight writes into this layer's gradients: let it finish.
  if (reduction_) {
    try {
      reduction_->finish();
    } catch (const Error& e) {
      QMESH_LOG_WARN(grads_.empty() ? std::string("an fsdp layer") : grads_.front().param->name,
                     ": its gradient reduction failed while the layer was destroyed: ", e.what());
    }
  }
}

Parameter FsdpLayer::shard_parameter(std::string name, Tensor init) const {
  if (!enabled()) return qmesh::make_parameter(std::move(name), std::move(init), ctx_.device());
  Parameter p = qmesh::make_parameter(std::move(name), ctx_.fsdp().shard_of(init), ctx_.device());
  p.fsdp_numel = init.numel();
  return p;
}

int FsdpLayer::add_gather(Source source) {
  slots_.push_back({std::move(source), StreamOrderedTensor()});
  return int(slots_.size()) - 1;
}

Stream FsdpLayer::comm_stream() const {
  const Placement& place = ctx_.placement();
  const bool own = ctx_.device().is_cuda() && place.comm_stream.handle &&
                   place.comm_stream.handle != place.stream.handle;
  return own ? place.comm_stream : ctx_.stream();
}

void FsdpLayer::start(bool forward) {
  if (forward ? fresh_for_forward_ : gathered_) return;
  release();                       // a gather made for another pass
  std::vector<TensorView> shards;  // a source casts the shard (forward): call it once
  for (Slot& slot : slots_) {
    shards.push_back(slot.source(forward));
    const TensorView& shard = shards.back();
    if (!shard.empty())
      slot.full.ensure(shard.dtype, Shape{shard.numel() * ctx_.fsdp().size()}, shard.device,
                       ctx_.stream());
  }
  // The gathers start after the shards' casts and every earlier use of the buffers, all
  // enqueued on the compute stream so far.
  order_after(ctx_.device(), comm_stream(), ctx_.stream());
  for (size_t i = 0; i < slots_.size(); ++i)
    if (!shards[i].empty())
      works_.push_back(
          ctx_.fsdp().all_gather_async(shards[i], slots_[i].full.view(), comm_stream()));
  gathered_ = true;
  fresh_for_forward_ = forward;
}

void FsdpLayer::acquire(bool forward) {
  start(forward);
  ctx_.fsdp_prefetch().after(prefetch_index_, forward, ctx_.fsdp_options().prefetch);
  wait_gathers();
  fresh_for_forward_ = false;
}

TensorView FsdpLayer::gathered(int slot) const {
  const StreamOrderedTensor& full = slots_.at(size_t(slot)).full;
  QMESH_CHECK(gathered_ && !full.empty(), "FsdpLayer: slot ", slot, " was not gathered");
  return full.view();
}

void FsdpLayer::wait_gathers() {
  if (works_.empty()) return;
  for (WorkHandle& work : works_)
    if (work) work->wait();
  works_.clear();
  order_after(ctx_.device(), ctx_.stream(), comm_stream());
}

void FsdpLayer::release() {
  wait_gathers();
  gathered_ = fresh_for_forward_ = false;
  for (Slot& slot : slots_) slot.full.reset();
}

void FsdpLayer::add_grads(std::vector<Parameter*> params) {
  if (!enabled()) return;
  int64_t pad = 0;
  for (Parameter* p : params) {
    grads_.push_back({p, StreamOrderedTensor()});
    pad = std::max(pad, p->value.numel() * ctx_.fsdp().size() - p->fsdp_numel);
  }
  if (pad > 0) {
    Tensor zeros(DType::kFloat32, Shape{pad});
    std::fill_n(zeros.data_as<float>(), pad, 0.0f);
    grad_padding_ = clone(zeros, ctx_.device());
  }
}

TensorView FsdpLayer::full_grad(const Parameter& p, const Shape& shape) {
  auto it =
      std::find_if(grads_.begin(), grads_.end(), [&](const Grad& g) { return g.param == &p; });
  QMESH_CHECK(it != grads_.end(), p.name, ": not a gradient of this fsdp layer");
  const int64_t n = shape.numel(), total = p.value.numel() * ctx_.fsdp().size();
  QMESH_CHECK(n == p.fsdp_numel, p.name, ": a full gradient of ", p.fsdp_numel,
              " elements cannot have shape ", shape.str());
  float* full = static_cast<float*>(
      it->full.ensure(DType::kFloat32, Shape{total}, ctx_.device(), ctx_.stream()).data);
  if (total > n)
    copy_bytes_async(full + n, ctx_.device(), grad_padding_.data(), ctx_.device(),
                     size_t(total - n) * sizeof(float), ctx_.stream());
  return TensorView(full, DType::kFloat32, shape, ctx_.device());
}

void FsdpLayer::reduce_grads() {
  if (!enabled()) return;
  release();
  ctx_.fsdp_prefetch().finish_deferred();
  auto pending = std::make_shared<PendingReduction>();
  pending->device = ctx_.device();
  pending->compute = ctx_.stream();
  pending->comm = comm_stream();
  order_after(pending->device, pending->comm, pending->compute);  // after the full gradients
  for (Grad& g : grads_) {
    if (g.full.empty()) continue;  // not written by this backward
    pending->works.push_back(
        ctx_.fsdp().reduce_scatter_async(g.full.view(), g.param->grad, pending->comm));
    pending->buffers.push_back(std::move(g.full));
  }
  reduction_ = pending;
  ctx_.fsdp_prefetch().defer([pending] { pending->finish(); });
}

}  // namespace qmesh
