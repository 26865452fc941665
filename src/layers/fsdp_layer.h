// One layer's side of FSDP (internal; qmesh/layers/fsdp.h, docs/design/fsdp.md): the layer's
// sharded parameters, their all-gathers for a pass (registered with the context's prefetch
// order), and the reduce-scatter of the layer's full gradients into the shards. Dense (its
// weight cast before the gather, its bias) and LayerNorm (gamma, beta) use it alike.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "layers/stream_ordered_tensor.h"
#include "qmesh/comm/communicator.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/layers/parameter.h"
#include "qmesh/tensor.h"

namespace qmesh {

class FsdpLayer {
 public:
  // What a gather slot sends in a pass: this rank's shard (flat, any dtype, on the context's
  // device), or an empty view to gather nothing in that pass. Called when the gather starts.
  using Source = std::function<TensorView(bool forward)>;

  // Registers with ctx's prefetch order when ctx.fsdp().enabled() (construct layers in the
  // order forward runs them). Not movable: the prefetch order and the reductions hold it.
  explicit FsdpLayer(LayerContext& ctx);
  // Leaves the prefetch order and completes a gradient reduction still in flight.
  ~FsdpLayer();
  FsdpLayer(const FsdpLayer&) = delete;
  FsdpLayer& operator=(const FsdpLayer&) = delete;

  bool enabled() const { return ctx_.fsdp().enabled(); }
  // A parameter with the initial (tp-local) values `init`: under FSDP this rank's flat,
  // zero-padded shard of them (Parameter::fsdp_numel set), else all of them.
  Parameter shard_parameter(std::string name, Tensor init) const;

  // Adds a gather slot (in the order the layer's gathers are issued, the same on every rank).
  int add_gather(Source source);
  // Starts the gathers for a pass (forward: cast and gather; backward: gather forward's cast
  // again), unless a gather for it is already under way or done (prefetched, or kept from
  // forward for backward); a gather made for the other pass is released first.
  void start(bool forward);
  // start(forward), then the starts of the next FsdpOptions::prefetch layers of the pass, then
  // waits for this layer's gathers.
  void acquire(bool forward);
  // The gathered, padded, flat form of a slot after acquire(): every fsdp rank's shard in order.
  TensorView gathered(int slot) const;
  // Frees the gathered buffers in the compute stream's order (after the work queued there that
  // reads them; the gathers in flight are waited for first).
  void release();

  // The sharded parameters whose full gradients backward writes, in the order their
  // reduce-scatters are issued. Call once, after shard_parameter.
  void add_grads(std::vector<Parameter*> params);
  // Where backward writes the full gradient of `p` (one of add_grads), shaped `shape` (its
  // fsdp_numel elements): a buffer whose zero padding reduce_grads() includes.
  TensorView full_grad(const Parameter& p, const Shape& shape);
  // After backward: releases the gathered buffers, completes the previous layer's reduction,
  // and starts the reduce-scatter of the full gradients into the parameters' grads, summed over
  // the data-parallel ranks; it stays in flight until the next layer's backward or
  // LayerContext::end_step() completes it.
  void reduce_grads();

 private:
  struct Slot {
    Source source;
    StreamOrderedTensor full;  // allocated and released on the compute stream
  };
  struct Grad {
    Parameter* param;
    StreamOrderedTensor full;  // allocated on the compute stream, released on the comm stream
  };
  struct PendingReduction;  // the reduce-scatters in flight and the full gradients they read

  // The stream of the gathers and reduce-scatters: on CUDA the context's communication stream
  // when it has one (distinct from the compute stream), so that they overlap the GEMMs, ordered
  // with events; else the compute stream.
  Stream comm_stream() const;
  // Waits for the gathers in flight; the compute stream's later work is ordered after them.
  void wait_gathers();

  LayerContext& ctx_;
  std::vector<Slot> slots_;
  std::vector<WorkHandle> works_;   // gathers in flight into the slots
  bool gathered_ = false;           // the slots hold (or receive) this step's values
  bool fresh_for_forward_ = false;  // ... cast for a forward that has not used them yet
  int prefetch_index_ = -1;         // in the context's FsdpPrefetch
  std::vector<Grad> grads_;
  Tensor grad_padding_;                          // zeros for the padding of the full gradients
  std::shared_ptr<PendingReduction> reduction_;  // the last one started (shared with FsdpPrefetch)
};

}  // namespace qmesh
