// A Communicator decorator that forwards every call to another communicator and counts the
// collectives issued through it (tests that prove how many collectives an algorithm uses).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "qmesh/comm/communicator.h"

namespace qmesh::testing {

// Counts all_reduce calls and every collective (split and host_ids included), and the bytes
// each rank contributes to all-gathers. With `count_splits`, the communicators split from this
// one count too, into the same all-gather byte counter (a mesh built over it counts its
// axes' gathers).
class CountingCommunicator : public Communicator {
 public:
  explicit CountingCommunicator(std::shared_ptr<Communicator> inner, bool count_splits = false,
                                std::shared_ptr<std::atomic<int64_t>> gather_bytes = nullptr)
      : inner_(std::move(inner)),
        count_splits_(count_splits),
        gather_bytes_(gather_bytes ? std::move(gather_bytes)
                                   : std::make_shared<std::atomic<int64_t>>(0)) {}

  int collectives() const { return collectives_; }
  int all_reduces() const { return all_reduces_; }
  int64_t all_gather_bytes() const { return *gather_bytes_; }

  WorkHandle all_reduce_async(TensorView buf, ReduceOp op, Stream stream) override {
    ++collectives_;
    ++all_reduces_;
    return inner_->all_reduce_async(buf, op, stream);
  }
  WorkHandle all_gather_async(TensorView in, TensorView out, Stream stream) override {
    ++collectives_;
    *gather_bytes_ += int64_t(in.nbytes());
    return inner_->all_gather_async(in, out, stream);
  }
  WorkHandle reduce_scatter_async(TensorView in, TensorView out, ReduceOp op,
                                  Stream stream) override {
    ++collectives_;
    return inner_->reduce_scatter_async(in, out, op, stream);
  }
  WorkHandle broadcast_async(TensorView buf, int root, Stream stream) override {
    ++collectives_;
    return inner_->broadcast_async(buf, root, stream);
  }
  WorkHandle barrier_async() override {
    ++collectives_;
    return inner_->barrier_async();
  }
  WorkHandle send_async(TensorView in, int peer, int tag, Stream stream) override {
    return inner_->send_async(in, peer, tag, stream);
  }
  WorkHandle recv_async(TensorView out, int peer, int tag, Stream stream) override {
    return inner_->recv_async(out, peer, tag, stream);
  }
  int max_tag() const override { return inner_->max_tag(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend_name() const override { return inner_->backend_name(); }
  std::shared_ptr<Communicator> split(int color, int key) override {
    ++collectives_;
    auto child = inner_->split(color, key);
    if (!count_splits_ || !child) return child;
    return std::make_shared<CountingCommunicator>(std::move(child), true, gather_bytes_);
  }
  std::vector<int> host_ids() override {
    ++collectives_;
    return inner_->host_ids();
  }

 private:
  std::shared_ptr<Communicator> inner_;
  bool count_splits_;
  std::shared_ptr<std::atomic<int64_t>> gather_bytes_;
  std::atomic<int> collectives_{0};
  std::atomic<int> all_reduces_{0};
};

}  // namespace qmesh::testing
