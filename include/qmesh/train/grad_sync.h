// Data-parallel gradient reduction: sums every parameter's grad over the dp communicator,
// in buckets that are launched asynchronously as soon as their gradients are ready, so the
// reductions of late layers overlap the backward of earlier ones.
//
// Usage per step: after each block's backward, ready(block.parameters()); after the whole
// backward, finish(). Every rank must mark the same parameters in the same order.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"
#include "qmesh/layers/parameter.h"
#include "qmesh/stream.h"

namespace qmesh {

// How a bucket's sum is formed: the backend's all-reduce (asynchronous), or on host
// gradients summed in rank order (comm/ordered_reduce.h; blocking, launched when the bucket
// is complete), bit-identical to the FSDP layers' gradient reduce-scatter.
enum class GradSyncOrder { kBackend, kRankOrder };

class QMESH_API GradSync {
 public:
  // `params` in the order their gradients become ready (reverse layer order). Buckets hold
  // consecutive parameters up to bucket_bytes (a larger parameter gets a bucket alone).
  // fp32 gradients, all on one device (host or CUDA; Error otherwise). For CUDA gradients
  // `dp` must carry CUDA buffers (NCCL, local backend), and the bucket copies and
  // all-reduces are ordered on `stream` (ignored on the host).
  // FSDP-sharded parameters (Parameter::fsdp_sharded) are an Error: backward reduces them.
  GradSync(std::shared_ptr<Communicator> dp, std::vector<Parameter*> params,
           size_t bucket_bytes = 4u << 20, Stream stream = {},
           GradSyncOrder order = GradSyncOrder::kBackend);
  ~GradSync();

  // Marks these parameters' gradients final for this step; launches the all-reduce of each
  // bucket that became complete. Error if a parameter is unknown or marked twice.
  void ready(const std::vector<Parameter*>& params);
  // Waits for every bucket (comm timeout applies) and writes the sums back into the grads
  // (CUDA: the copies back are enqueued on the stream; synchronize it before reading the
  // grads on the host).
  // Error if some parameter was never marked ready.
  void finish();

  size_t bucket_count() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qmesh
