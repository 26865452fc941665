// A Communicator decorator for train_mlp --timing: forwards every call to another
// communicator and adds the wall time that callers spend blocked in Work::wait (the blocking
// collectives wait on their Work too) to a clock shared with every communicator split from
// it. That time is the communication a step could not hide behind computation. One-sided
// access is not forwarded (one_sided() is nullptr), so collective-GEMM rings run over the
// timed point-to-point path.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "qmesh/comm/communicator.h"

namespace train_mlp {

class TimedCommunicator : public qmesh::Communicator {
 public:
  explicit TimedCommunicator(std::shared_ptr<qmesh::Communicator> inner);

  // Seconds spent in Work::wait on this communicator and those split from it.
  double waited_s() const;

  qmesh::WorkHandle all_reduce_async(qmesh::TensorView buf, qmesh::ReduceOp op,
                                     qmesh::Stream stream) override;
  qmesh::WorkHandle all_gather_async(qmesh::TensorView in, qmesh::TensorView out,
                                     qmesh::Stream stream) override;
  qmesh::WorkHandle reduce_scatter_async(qmesh::TensorView in, qmesh::TensorView out,
                                         qmesh::ReduceOp op, qmesh::Stream stream) override;
  qmesh::WorkHandle broadcast_async(qmesh::TensorView buf, int root, qmesh::Stream stream) override;
  qmesh::WorkHandle barrier_async() override;
  qmesh::WorkHandle send_async(qmesh::TensorView in, int peer, int tag,
                               qmesh::Stream stream) override;
  qmesh::WorkHandle recv_async(qmesh::TensorView out, int peer, int tag,
                               qmesh::Stream stream) override;
  int max_tag() const override { return inner_->max_tag(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend_name() const override { return inner_->backend_name(); }
  bool stream_ordered() const override { return inner_->stream_ordered(); }
  std::shared_ptr<qmesh::Communicator> split(int color, int key) override;
  std::vector<int> host_ids() override { return inner_->host_ids(); }

 private:
  using Clock = std::shared_ptr<std::atomic<int64_t>>;  // nanoseconds waited
  TimedCommunicator(std::shared_ptr<qmesh::Communicator> inner, Clock clock);
  qmesh::WorkHandle timed(qmesh::WorkHandle work) const;

  std::shared_ptr<qmesh::Communicator> inner_;
  Clock waited_ns_;
};

}  // namespace train_mlp
