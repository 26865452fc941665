#include "timed_comm.h"

#include <utility>

namespace train_mlp {
namespace {

class TimedWork : public qmesh::Work {
 public:
  TimedWork(qmesh::WorkHandle inner, std::shared_ptr<std::atomic<int64_t>> waited_ns)
      : Work(inner->what(), inner->timeout(), inner->timeout_source()),
        inner_(std::move(inner)),
        waited_ns_(std::move(waited_ns)) {}

 protected:
  bool poll() override { return inner_->test(); }
  bool block_until(const qmesh::Deadline& deadline) override {
    const auto start = Clock::now();
    struct Add {  // also when wait throws
      Clock::time_point start;
      std::atomic<int64_t>& total;
      ~Add() {
        total += std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
      }
    } add{start, *waited_ns_};
    inner_->wait(deadline.left());
    return true;
  }

 private:
  qmesh::WorkHandle inner_;
  std::shared_ptr<std::atomic<int64_t>> waited_ns_;
};

}  // namespace

TimedCommunicator::TimedCommunicator(std::shared_ptr<qmesh::Communicator> inner)
    : TimedCommunicator(std::move(inner), std::make_shared<std::atomic<int64_t>>(0)) {}

TimedCommunicator::TimedCommunicator(std::shared_ptr<qmesh::Communicator> inner, Clock clock)
    : inner_(std::move(inner)), waited_ns_(std::move(clock)) {
  if (inner_->timeout_source() == qmesh::TimeoutSource::kCommunicator)
    set_timeout(inner_->timeout());
}

double TimedCommunicator::waited_s() const { return double(waited_ns_->load()) * 1e-9; }

qmesh::WorkHandle TimedCommunicator::timed(qmesh::WorkHandle work) const {
  return std::make_unique<TimedWork>(std::move(work), waited_ns_);
}

qmesh::WorkHandle TimedCommunicator::all_reduce_async(qmesh::TensorView buf, qmesh::ReduceOp op,
                                                      qmesh::Stream stream) {
  return timed(inner_->all_reduce_async(buf, op, stream));
}
qmesh::WorkHandle TimedCommunicator::all_gather_async(qmesh::TensorView in, qmesh::TensorView out,
                                                      qmesh::Stream stream) {
  return timed(inner_->all_gather_async(in, out, stream));
}
qmesh::WorkHandle TimedCommunicator::reduce_scatter_async(qmesh::TensorView in,
                                                          qmesh::TensorView out, qmesh::ReduceOp op,
                                                          qmesh::Stream stream) {
  return timed(inner_->reduce_scatter_async(in, out, op, stream));
}
qmesh::WorkHandle TimedCommunicator::broadcast_async(qmesh::TensorView buf, int root,
                                                     qmesh::Stream stream) {
  return timed(inner_->broadcast_async(buf, root, stream));
}
qmesh::WorkHandle TimedCommunicator::barrier_async() { return timed(inner_->barrier_async()); }
qmesh::WorkHandle TimedCommunicator::send_async(qmesh::TensorView in, int peer, int tag,
                                                qmesh::Stream stream) {
  return timed(inner_->send_async(in, peer, tag, stream));
}
qmesh::WorkHandle TimedCommunicator::recv_async(qmesh::TensorView out, int peer, int tag,
                                                qmesh::Stream stream) {
  return timed(inner_->recv_async(out, peer, tag, stream));
}

std::shared_ptr<qmesh::Communicator> TimedCommunicator::split(int color, int key) {
  std::shared_ptr<qmesh::Communicator> part = inner_->split(color, key);
  if (!part) return nullptr;
  return std::shared_ptr<qmesh::Communicator>(new TimedCommunicator(std::move(part), waited_ns_));
}

}  // namespace train_mlp
