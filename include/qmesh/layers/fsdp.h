// Fully sharded data parallelism (FSDP): how the layers split their parameters over the
// mesh's fsdp axis and move them (docs/design/fsdp.md).
//
// A parameter's value (its tp-local part, `numel` elements, flattened row-major) is cut into
// `fsdp size` equal shards of shard_numel(numel) elements, the last ones padded with zeros,
// and rank f of the fsdp axis keeps elements [f * shard, (f + 1) * shard). Gradients,
// fp32 master weights and optimizer state live only as shards. A layer all-gathers the
// weights (as the GEMM operand: FP8 codes, bf16 or fp32) before use, and reduce-scatters its
// full weight gradient over the data-parallel ranks (dp × fsdp) into the shard.
//
// Data-parallel ranks: the ranks that differ only along the dp and fsdp axes, numbered by
// world rank (data_rank()); each processes its own slice of the global batch. On the host the
// gradients are summed in data-rank order (comm/ordered_reduce.h), so dp = N, fsdp = N and
// every dp × fsdp = N give bit-identical training when GradSync also sums in rank order.
#pragma once

#include <cstdint>
#include <memory>

#include "qmesh/comm/mesh.h"
#include "qmesh/export.h"
#include "qmesh/layers/parameter.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

struct FsdpOptions {
  // Keep each layer's gathered weights from forward until its backward (one all-gather per
  // step instead of two; the memory of every gathered layer until backward).
  bool keep_gathered = false;
  // Prefetch: while a layer computes, the all-gathers of up to this many following layers
  // (forward: the next ones in construction order; backward: the previous ones) are already
  // in flight. 0 gathers each layer's weights only when it runs. Each prefetched layer holds
  // its gathered weights until it has run.
  int prefetch = 1;
};

class QMESH_API FsdpGroup {
 public:
  // The communicators of the mesh's fsdp and dp roles. enabled() is false when the mesh has
  // no fsdp role: then nothing is sharded.
  explicit FsdpGroup(const Mesh& mesh);

  bool enabled() const { return enabled_; }
  int size() const { return fsdp_->size(); }  // fsdp ranks (1 when not enabled)
  int rank() const { return fsdp_->rank(); }
  // This rank's index among the data-parallel ranks (dp × fsdp), and their number.
  int data_rank() const { return data_->rank(); }
  int data_size() const { return data_->size(); }
  const std::shared_ptr<Communicator>& data_group() const { return data_; }

  // Elements per shard of a tensor of `numel` elements: ceil(numel / size()), rounded up
  // to a multiple of the dp size (the gradient reduce-scatter splits a shard over dp).
  int64_t shard_numel(int64_t numel) const;
  // The same for any layout: `fsdp` shards, their pieces split over `dp` ranks (checkpoints
  // written by another layout).
  static int64_t shard_numel(int64_t numel, int fsdp, int dp);
  // This rank's shard of a host tensor of any dtype (flattened), zero-padded: [shard_numel].
  Tensor shard_of(const TensorView& full) const;
  // full: [size() * shard.numel()] of shard's dtype and device; every fsdp rank's shard in
  // rank order. Blocking on the host; on CUDA ordered on `stream`.
  void all_gather(const TensorView& shard, const TensorView& full, Stream stream = {}) const;
  // The same, asynchronous: wait on the handle before using `full` (nullptr: nothing for the
  // host to wait for: fsdp has one rank, or the gather of CUDA buffers is stream-ordered on
  // `stream`, as NCCL's).
  WorkHandle all_gather_async(const TensorView& shard, const TensorView& full,
                              Stream stream = {}) const;
  // The whole (tp-local) value of a parameter as a flat fp32 host tensor: a sharded one's
  // shards all-gathered (collective over fsdp; blocking) without the padding, else a copy.
  Tensor full_value(const Parameter& p) const;
  // full: fp32 [size() * shard.numel()], this rank's gradient of the whole tensor (padding
  // zero). shard becomes the sum over every data-parallel rank of their `full`, this
  // rank's part (host: summed in data-rank order). Every data-parallel rank calls it.
  void reduce_scatter(const TensorView& full, const TensorView& shard, Stream stream = {}) const;
  // The same, asynchronous: `full` and `shard` must stay alive and `full` unchanged until
  // the handle's wait() returns (its dp all-gather is issued there). Every data-parallel
  // rank completes its handles in the same order.
  WorkHandle reduce_scatter_async(const TensorView& full, const TensorView& shard,
                                  Stream stream = {}) const;

 private:
  bool enabled_ = false;
  bool dp_outer_ = false;  // the dp axis precedes the fsdp axis in the mesh
  std::shared_ptr<Communicator> fsdp_, dp_, data_;
};

}  // namespace qmesh
