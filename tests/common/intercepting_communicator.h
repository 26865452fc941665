// A Communicator decorator that lets a test see every call before it is forwarded to another
// communicator: to count collectives (counting_communicator.h) or to make a rank stop at a
// chosen moment (tests/faults/local_fault.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "qmesh/comm/communicator.h"

namespace qmesh::testing {

class InterceptingCommunicator : public Communicator {
 public:
  enum class Call {
    kAllReduce,
    kAllGather,
    kReduceScatter,
    kBroadcast,
    kBarrier,
    kSend,
    kRecv,
    kSplit,
    kHostIds
  };
  // Runs before each call is forwarded: the call and the bytes of its input (all-reduce and
  // broadcast: the buffer; receive: the output; 0 for barrier, split and host_ids). It may
  // throw or block, as the call itself could.
  using Hook = std::function<void(Call call, int64_t bytes)>;

  // With `wrap_splits`, the communicators split from this one are intercepted by the same
  // hook (a mesh built over it then shows its axes' calls too). Takes the timeout that was
  // set on `inner`, if any.
  InterceptingCommunicator(std::shared_ptr<Communicator> inner, Hook hook, bool wrap_splits)
      : inner_(std::move(inner)), hook_(std::move(hook)), wrap_splits_(wrap_splits) {
    if (inner_->timeout_source() == TimeoutSource::kCommunicator) set_timeout(inner_->timeout());
  }

  WorkHandle all_reduce_async(TensorView buf, ReduceOp op, Stream stream) override {
    hook_(Call::kAllReduce, int64_t(buf.nbytes()));
    return inner_->all_reduce_async(buf, op, stream);
  }
  WorkHandle all_gather_async(TensorView in, TensorView out, Stream stream) override {
    hook_(Call::kAllGather, int64_t(in.nbytes()));
    return inner_->all_gather_async(in, out, stream);
  }
  WorkHandle reduce_scatter_async(TensorView in, TensorView out, ReduceOp op,
                                  Stream stream) override {
    hook_(Call::kReduceScatter, int64_t(in.nbytes()));
    return inner_->reduce_scatter_async(in, out, op, stream);
  }
  WorkHandle broadcast_async(TensorView buf, int root, Stream stream) override {
    hook_(Call::kBroadcast, int64_t(buf.nbytes()));
    return inner_->broadcast_async(buf, root, stream);
  }
  WorkHandle barrier_async() override {
    hook_(Call::kBarrier, 0);
    return inner_->barrier_async();
  }
  WorkHandle send_async(TensorView in, int peer, int tag, Stream stream) override {
    hook_(Call::kSend, int64_t(in.nbytes()));
    return inner_->send_async(in, peer, tag, stream);
  }
  WorkHandle recv_async(TensorView out, int peer, int tag, Stream stream) override {
    hook_(Call::kRecv, int64_t(out.nbytes()));
    return inner_->recv_async(out, peer, tag, stream);
  }
  int max_tag() const override { return inner_->max_tag(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend_name() const override { return inner_->backend_name(); }
  bool stream_ordered() const override { return inner_->stream_ordered(); }
  std::shared_ptr<Communicator> split(int color, int key) override {
    hook_(Call::kSplit, 0);
    auto child = inner_->split(color, key);
    if (!wrap_splits_ || !child) return child;
    return std::make_shared<InterceptingCommunicator>(std::move(child), hook_, true);
  }
  std::vector<int> host_ids() override {
    hook_(Call::kHostIds, 0);
    return inner_->host_ids();
  }

 private:
  std::shared_ptr<Communicator> inner_;
  Hook hook_;
  bool wrap_splits_;
};

}  // namespace qmesh::testing
