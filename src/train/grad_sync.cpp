#include "qmesh/train/grad_sync.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "qmesh/comm/composite_work.h"
#include "qmesh/comm/deadline.h"
#include "qmesh/comm/ordered_reduce.h"
#include "qmesh/copy.h"
#include "qmesh/error.h"

namespace qmesh {

namespace {
struct Bucket {
  std::vector<Parameter*> params;
  Tensor flat;  // fp32 on the gradients' device, the concatenated gradients
  size_t pending = 0;
  WorkHandle work;
};
}  // namespace

struct GradSync::Impl {
  std::shared_ptr<Communicator> dp;
  Stream stream;
  GradSyncOrder order = GradSyncOrder::kBackend;
  Device device;  // of every gradient
  std::vector<Bucket> buckets;
  std::map<const Parameter*, size_t> bucket_of;
  std::map<const Parameter*, bool> marked;

  // After a failed wait: the other buckets' reductions get no more time (so that dropping
  // them does not wait a further timeout each) and are dropped.
  void abandon() {
    for (Bucket& b : buckets) {
      if (!b.work) continue;
      try {
        b.work->wait(std::chrono::milliseconds(0));
      } catch (const Error&) {  // the first error is the one reported
      }
      b.work.reset();
      b.pending = 0;
    }
    marked.clear();
  }

  void launch(Bucket& b) {
    float* out = b.flat.data_as<float>();
    for (Parameter* p : b.params) {
      copy_bytes_async(out, device, p->grad.data(), device, p->grad.nbytes(), stream);
      out += p->grad.numel();
    }
    if (order == GradSyncOrder::kRankOrder) {
      ordered_all_reduce(*dp, b.flat);
      // Finished when launched: a composite without parts.
      b.work = std::make_unique<CompositeWork>("rank-ordered gradient all_reduce", *dp);
      return;
    }
    b.work = dp->all_reduce_async(b.flat, ReduceOp::kSum, stream);
  }
};

GradSync::GradSync(std::shared_ptr<Communicator> dp, std::vector<Parameter*> params,
                   size_t bucket_bytes, Stream stream, GradSyncOrder order)
    : impl_(std::make_unique<Impl>()) {
  QMESH_CHECK(dp != nullptr, "GradSync needs a data-parallel communicator");
  impl_->dp = std::move(dp);
  impl_->stream = stream;
  impl_->order = order;
  if (!params.empty()) impl_->device = params.front()->grad.device();
  std::vector<std::vector<Parameter*>> groups;
  size_t bytes = 0;
  for (Parameter* p : params) {
    check_dtype(p->grad, DType::kFloat32, p->name + ".grad");
    check_device(p->grad, impl_->device, p->name + ".grad (every gradient on one device)");
    QMESH_CHECK(!impl_->bucket_of.count(p), "parameter ", p->name, " is listed twice");
    QMESH_CHECK(!p->fsdp_sharded(), "parameter ", p->name,
                " is fsdp-sharded: its backward already reduced its gradient; leave it out of "
                "GradSync");
    QMESH_CHECK(order == GradSyncOrder::kBackend || impl_->device.is_host(),
                "GradSyncOrder::kRankOrder needs host gradients; ", p->name, " is on ",
                impl_->device.str());
    if (groups.empty() || bytes + p->grad.nbytes() > bucket_bytes) {
      groups.emplace_back();
      bytes = 0;
    }
    groups.back().push_back(p);
    bytes += p->grad.nbytes();
    impl_->bucket_of[p] = groups.size() - 1;
  }
  for (auto& g : groups) {
    int64_t n = 0;
    for (Parameter* p : g) n += p->grad.numel();
    impl_->buckets.push_back(
        Bucket{g, Tensor(DType::kFloat32, Shape{n}, impl_->device), 0, nullptr});
  }
}

GradSync::~GradSync() = default;

size_t GradSync::bucket_count() const { return impl_->buckets.size(); }

void GradSync::ready(const std::vector<Parameter*>& params) {
  for (Parameter* p : params) {
    const auto it = impl_->bucket_of.find(p);
    QMESH_CHECK(it != impl_->bucket_of.end(), "parameter ", p->name, " was not given to GradSync");
    QMESH_CHECK(!impl_->marked[p], "parameter ", p->name, " marked ready twice in one step");
    impl_->marked[p] = true;
    Bucket& b = impl_->buckets[it->second];
    if (++b.pending == b.params.size()) impl_->launch(b);
  }
}

void GradSync::finish() {
  // One deadline for the step's reduction, whatever the number of buckets.
  const Deadline deadline(impl_->dp->timeout());
  for (Bucket& b : impl_->buckets) {
    if (b.work == nullptr) {
      std::string missing;
      for (const Parameter* p : b.params)
        if (!impl_->marked[p]) missing += (missing.empty() ? "" : ", ") + p->name;
      QMESH_THROW("GradSync::finish: parameter ", missing,
                  " was never marked ready this step: call ready(layer.parameters()) after each "
                  "layer's backward, before finish()");
    }
    try {
      b.work->wait(deadline.left());
    } catch (const Error&) {
      impl_->abandon();
      throw;
    }
    const float* in = b.flat.data_as<float>();
    for (Parameter* p : b.params) {
      copy_bytes_async(p->grad.data(), impl_->device, in, impl_->device, p->grad.nbytes(),
                       impl_->stream);
      in += p->grad.numel();
    }
    b.work.reset();
    b.pending = 0;
  }
  impl_->marked.clear();
}

}  // namespace qmesh
