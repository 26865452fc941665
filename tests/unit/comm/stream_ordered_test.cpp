// all_reduce_in_stream_order / all_gather_in_stream_order: the host waits for the operation
// except for device buffers over a stream-ordered communicator, where it is only enqueued.
// A scripted communicator records what was issued and whether it was waited for.
#include "qmesh/comm/stream_ordered.h"

#include <gtest/gtest.h>

#include <memory>
#include <string_view>
#include <vector>

#include "qmesh/error.h"

namespace qmesh {
namespace {

struct Log {
  int issued = 0, waited = 0;
};

// Complete at once; its first poll is the blocking wrapper's wait.
class RecordedWork : public Work {
 public:
  explicit RecordedWork(Log& log)
      : Work("recorded", std::chrono::seconds(1), TimeoutSource::kEnvironment), log_(log) {}

 protected:
  bool poll() override {
    ++log_.waited;
    return true;
  }

 private:
  Log& log_;
};

class ScriptedCommunicator : public Communicator {
 public:
  ScriptedCommunicator(bool stream_ordered, Log& log, int size = 2)
      : ordered_(stream_ordered), log_(log), size_(size) {}
  WorkHandle issue() {
    ++log_.issued;
    return std::make_unique<RecordedWork>(log_);
  }
  WorkHandle all_reduce_async(TensorView, ReduceOp, Stream) override { return issue(); }
  WorkHandle all_gather_async(TensorView, TensorView, Stream) override { return issue(); }
  WorkHandle reduce_scatter_async(TensorView, TensorView, ReduceOp, Stream) override {
    return issue();
  }
  WorkHandle broadcast_async(TensorView, int, Stream) override { return issue(); }
  WorkHandle barrier_async() override { return issue(); }
  WorkHandle send_async(TensorView, int, int, Stream) override { return issue(); }
  WorkHandle recv_async(TensorView, int, int, Stream) override { return issue(); }
  int max_tag() const override { return 1 << 20; }
  int rank() const override { return 0; }
  int size() const override { return size_; }
  std::string_view backend_name() const override { return "scripted"; }
  std::shared_ptr<Communicator> split(int, int) override { return nullptr; }
  std::vector<int> host_ids() override { return {0, 0}; }
  bool stream_ordered() const override { return ordered_; }

 private:
  bool ordered_;
  Log& log_;
  int size_;
};

TEST(StreamOrdered, DeviceBuffersOverAStreamOrderedBackendAreNotWaitedFor) {
  float storage[4] = {};
  const TensorView host(storage, DType::kFloat32, Shape{4});
  const TensorView device(storage, DType::kFloat32, Shape{4}, Device::cuda(0));  // never read
  const TensorView device_out(storage, DType::kFloat32, Shape{2}, Device::cuda(0));
  struct Case {
    bool ordered;
    const TensorView* buf;
    int waits;
  };
  for (const Case& c : {Case{true, &device, 0}, Case{true, &host, 1}, Case{false, &device, 1},
                        Case{false, &host, 1}}) {
    Log log;
    ScriptedCommunicator comm(c.ordered, log);
    all_reduce_in_stream_order(comm, *c.buf, ReduceOp::kSum, {});
    EXPECT_EQ(log.issued, 1);
    EXPECT_EQ(log.waited, c.waits) << "stream_ordered " << c.ordered << ", " << c.buf->device.str();
    Log gather_log;
    ScriptedCommunicator gather_comm(c.ordered, gather_log);
    all_gather_in_stream_order(gather_comm, *c.buf, c.buf == &host ? host : device_out, {});
    EXPECT_EQ(gather_log.issued, 1);
    EXPECT_EQ(gather_log.waited, c.waits);
  }
}

// One rank: no collective is issued (a one-GPU step never stages its amax through the host):
// all_reduce leaves the buffer, all_gather copies in to out.
TEST(StreamOrdered, OneRankIssuesNothing) {
  float storage[4] = {1, 2, 3, 4}, gathered[4] = {};
  const TensorView host(storage, DType::kFloat32, Shape{4});
  const TensorView device(storage, DType::kFloat32, Shape{4}, Device::cuda(0));  // never read
  for (bool ordered : {true, false}) {
    Log log;
    ScriptedCommunicator comm(ordered, log, 1);
    all_reduce_in_stream_order(comm, host, ReduceOp::kSum, {});
    all_reduce_in_stream_order(comm, device, ReduceOp::kMax, {});
    all_gather_in_stream_order(comm, host, TensorView(gathered, DType::kFloat32, Shape{4}), {});
    all_gather_in_stream_order(comm, host, host, {});  // in place
    EXPECT_EQ(log.issued, 0) << "stream_ordered " << ordered;
    EXPECT_EQ(log.waited, 0);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(gathered[i], storage[i]);
    EXPECT_EQ(storage[3], 4.0f);
  }
  Log log;
  ScriptedCommunicator comm(false, log, 1);
  EXPECT_THROW(
      all_gather_in_stream_order(comm, host, TensorView(gathered, DType::kFloat32, Shape{3}), {}),
      Error);
}

}  // namespace
}  // namespace qmesh
