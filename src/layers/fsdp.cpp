#include "qmesh/layers/fsdp.h"

#include <cstring>
#include <vector>

#include "qmesh/comm/composite_work.h"
#include "qmesh/comm/ordered_reduce.h"
#include "qmesh/comm/stream_ordered.h"
#include "qmesh/copy.h"
#include "qmesh/error.h"

namespace qmesh {

namespace {

int axis_position(const Mesh& mesh, const std::string& name) {
  const auto& axes = mesh.axes();
  for (size_t i = 0; i < axes.size(); ++i)
    if (axes[i].name == name) return int(i);
  return -1;
}

}  // namespace

FsdpGroup::FsdpGroup(const Mesh& mesh) {
  const MeshResource& roles = mesh.resource();
  enabled_ = !roles.fsdp.empty();
  fsdp_ = mesh.role(roles.fsdp);
  dp_ = mesh.role(roles.dp);
  if (enabled_ && !roles.dp.empty()) {
    data_ = mesh.group({roles.dp, roles.fsdp});
    dp_outer_ = axis_position(mesh, roles.dp) < axis_position(mesh, roles.fsdp);
  } else {
    data_ = enabled_ ? fsdp_ : dp_;
  }
}

int64_t FsdpGroup::shard_numel(int64_t numel) const {
  return shard_numel(numel, size(), dp_->size());
}

int64_t FsdpGroup::shard_numel(int64_t numel, int fsdp, int dp) {
  QMESH_CHECK(numel >= 1, "an fsdp-sharded tensor needs at least one element, got ", numel);
  QMESH_CHECK(fsdp >= 1 && dp >= 1, "fsdp and dp sizes must be >= 1, got ", fsdp, " and ", dp);
  const int64_t per = (numel + fsdp - 1) / fsdp;
  return (per + dp - 1) / dp * dp;
}

Tensor FsdpGroup::shard_of(const TensorView& full) const {
  QMESH_CHECK(full.device.is_host(), "FsdpGroup::shard_of takes a host tensor, got one on ",
              full.device.str());
  const int64_t n = full.numel(), s = shard_numel(n);
  const size_t es = dtype_size(full.dtype);
  Tensor shard(full.dtype, Shape{s});
  std::memset(shard.data(), 0, size_t(s) * es);
  const int64_t begin = std::min(n, rank() * s), end = std::min(n, begin + s);
  std::memcpy(shard.data(), static_cast<const char*>(full.data) + begin * int64_t(es),
              size_t(end - begin) * es);
  return shard;
}

void FsdpGroup::all_gather(const TensorView& shard, const TensorView& full, Stream stream) const {
  if (WorkHandle work = all_gather_async(shard, full, stream)) work->wait();
}

WorkHandle FsdpGroup::all_gather_async(const TensorView& shard, const TensorView& full,
                                       Stream stream) const {
  QMESH_CHECK(full.numel() == shard.numel() * size() && full.dtype == shard.dtype,
              "FsdpGroup::all_gather: the output must hold ", size(), " shards of ", shard.numel(),
              " ", dtype_name(shard.dtype), " elements, got ", full.numel(), " ",
              dtype_name(full.dtype));
  if (size() == 1) {
    copy_bytes_async(full.data, full.device, shard.data, shard.device, shard.nbytes(), stream);
    return nullptr;
  }
  WorkHandle work = fsdp_->all_gather_async(shard.slice(0, Shape{shard.numel()}),
                                            full.slice(0, Shape{full.numel()}), stream);
  // NCCL with CUDA buffers: ordered on `stream`, nothing for the host to wait for (dropping
  // the handle does not block).
  if (completes_in_stream_order(*fsdp_, full)) return nullptr;
  return work;
}

Tensor FsdpGroup::full_value(const Parameter& p) const {
  Tensor local = clone(p.value, Device::host());
  if (!p.fsdp_sharded()) return local;
  Tensor gathered(DType::kFloat32, Shape{local.numel() * size()});
  all_gather(local, gathered);
  Tensor out(DType::kFloat32, Shape{p.fsdp_numel});
  std::memcpy(out.data(), gathered.data(), out.nbytes());
  return out;
}

namespace {

// The data-group reduce-scatter in flight, then (dp > 1) the all-gather of the pieces over
// dp into the shard, issued when the reduce-scatter completes; both bounded by one wait's
// deadline. Its scratch buffers are kept by the composite. Keeps the data group's timeout.
class FsdpReduceWork : public CompositeWork {
 public:
  FsdpReduceWork(const Communicator& data, std::shared_ptr<Communicator> dp, TensorView shard,
                 Stream stream)
      : CompositeWork("FSDP gradient reduce_scatter", data),
        dp_(std::move(dp)),
        shard_(shard),
        stream_(stream) {}

  // The piece of the shard this rank reduces (dp > 1): gathered over dp into the shard once
  // the reduce-scatter (the first part) completes.
  void gather_piece(const TensorView& piece) { piece_ = piece; }

 protected:
  void next_stage() override {
    if (piece_.empty()) return;
    add(dp_->all_gather_async(piece_, shard_, stream_));
    piece_ = TensorView();
  }

 private:
  std::shared_ptr<Communicator> dp_;
  TensorView shard_;
  Stream stream_;
  TensorView piece_;
};

}  // namespace

void FsdpGroup::reduce_scatter(const TensorView& full, const TensorView& shard,
                               Stream stream) const {
  reduce_scatter_async(full, shard, stream)->wait();
}

WorkHandle FsdpGroup::reduce_scatter_async(const TensorView& full, const TensorView& shard,
                                           Stream stream) const {
  check_dtype(full, DType::kFloat32, "FSDP gradient");
  check_dtype(shard, DType::kFloat32, "FSDP gradient shard");
  const int64_t s = shard.numel(), f = size(), d = dp_->size();
  QMESH_CHECK(full.numel() == s * f && s % d == 0, "FsdpGroup::reduce_scatter: ", full.numel(),
              " elements do not make ", f, " shards of ", s, " (a multiple of dp=", d, ")");
  // Data rank c = (dp coordinate, fsdp coordinate) owns piece (its dp coordinate) of the
  // shard of its fsdp coordinate. Arrange the pieces in data-rank order.
  auto work = std::make_unique<FsdpReduceWork>(*data_, dp_, shard.slice(0, Shape{s}), stream);
  const int64_t piece = s / d;
  TensorView in = full.slice(0, Shape{full.numel()});
  if (dp_outer_ && d > 1 && f > 1) {
    const TensorView arranged =
        work->keep(Tensor(DType::kFloat32, Shape{full.numel()}, full.device));
    for (int64_t di = 0; di < d; ++di)
      for (int64_t fi = 0; fi < f; ++fi)
        copy_bytes_async(arranged.slice((di * f + fi) * piece, Shape{piece}).data, full.device,
                         full.slice(fi * s + di * piece, Shape{piece}).data, full.device,
                         size_t(piece) * 4, stream);
    in = arranged;
  }
  TensorView target = shard.slice(0, Shape{s});
  if (d > 1) {
    target = work->keep(Tensor(DType::kFloat32, Shape{piece}, full.device));
    work->gather_piece(target);
  }
  work->add(full.device.is_host()
                ? ordered_reduce_scatter_async(*data_, in, target)
                : data_->reduce_scatter_async(in, target, ReduceOp::kSum, stream));
  return work;
}

}  // namespace qmesh
