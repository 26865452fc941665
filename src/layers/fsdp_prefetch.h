// The order in which a context's FSDP layers gather their weights, for prefetching
// (FsdpOptions::prefetch), and their gradient reductions still in flight (internal). Layers
// register in construction order, which forward is assumed to follow (backward: the reverse). A
// prefetch that does not match the order the layers actually run in costs memory and time, never
// correctness: a layer uses a prefetched gather only if it was made for the pass it runs.
#pragma once

#include <functional>
#include <vector>

namespace qmesh {

class FsdpPrefetch {
 public:
  // start(forward): begins the layer's gather for a forward (cast and gather) or backward
  // (gather forward's cast again) pass, unless one is already in flight or done.
  using Start = std::function<void(bool forward)>;

  int add(Start start) {
    layers_.push_back(std::move(start));
    return int(layers_.size()) - 1;
  }
  void remove(int index) { layers_[size_t(index)] = nullptr; }

  // Starts the gathers of up to `ahead` registered layers after `index` in the pass's order.
  void after(int index, bool forward, int ahead) {
    const int step = forward ? 1 : -1;
    for (int k = 1, i = index + step; k <= ahead && i >= 0 && i < int(layers_.size());
         ++k, i += step)
      if (layers_[size_t(i)]) layers_[size_t(i)](forward);
  }

  // A layer's gradient reduce-scatter, left in flight while earlier layers run their
  // backward; `finish` completes it. finish_deferred() completes all, in the order they were
  // deferred (the same on every rank): before a layer defers its own, and in end_step().
  void defer(std::function<void()> finish) { deferred_.push_back(std::move(finish)); }
  void finish_deferred() {
    std::vector<std::function<void()>> pending;
    pending.swap(deferred_);
    for (auto& finish : pending) finish();
  }

 private:
  std::vector<Start> layers_;
  std::vector<std::function<void()>> deferred_;
};

}  // namespace qmesh
