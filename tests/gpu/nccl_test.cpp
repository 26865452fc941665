// The NCCL backend on one GPU (world size 1): every collective on device buffers, ordered on
// a caller's stream, against references computed here on the host; split, host ids, and the
// errors for bad arguments. Skipped without a GPU.
#include "qmesh/comm/nccl.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <optional>

#include "collective_suite.h"
#include "expect_error.h"
#include "qmesh/copy.h"
#include "qmesh/owned_stream.h"

namespace qmesh {
namespace {

// A copy of `t` on `device` (host <-> GPU 0).
Tensor copy_to(const Tensor& t, Device device) {
  Tensor c(t.dtype(), t.shape(), device);
  copy_tensor(c, t);
  return c;
}

const Device kGpu = Device::cuda(0);

class Nccl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device: the NCCL backend needs one";
    const auto dir =
        std::filesystem::temp_directory_path() / ("qmesh_nccl_test_" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    StoreBootstrap bootstrap(std::make_shared<FileStore>(dir), 0, 1, "nccl");
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    comm_ = make_nccl_world(bootstrap);
    std::filesystem::remove_all(dir);
    stream_.emplace(Device::cuda(0));
  }

  Stream stream() const { return stream_->get(); }

  std::shared_ptr<Communicator> comm_;
  std::optional<OwnedStream> stream_;
};

constexpr DType kReducible[] = {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                                DType::kInt32};
constexpr int64_t kSizes[] = {1, 1000, 4099};

// With one rank a reduction returns its input: this checks the plumbing of NCCL's all-reduce
// and reduce-scatter (every dtype and ReduceOp mapped, device buffers, the caller's stream),
// not reduction arithmetic, which needs two ranks and so two GPUs (NCCL refuses two ranks of
// one communicator on one device); the reduction algorithms over several ranks are tested
// on the other backends (tests/unit/comm).
TEST_F(Nccl, OneRankAllReduceAndReduceScatterReturnTheInput) {
  for (DType dtype : kReducible) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        Tensor buf = copy_to(testing::make_input(dtype, n, 0, 1), kGpu);
        comm_->all_reduce(buf, op, stream());
        Tensor out(dtype, Shape{n}, kGpu);
        Tensor in = copy_to(testing::make_input(dtype, n, 0, 2), kGpu);
        comm_->reduce_scatter(in, out, op, stream());
        const Tensor reduced = copy_to(buf, Device::host());
        const Tensor scattered = copy_to(out, Device::host());
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(testing::load(reduced, i), testing::reference_reduce(1, i, 1, dtype, op))
              << dtype_name(dtype) << " n=" << n << " element " << i;
          ASSERT_EQ(testing::load(scattered, i), testing::reference_reduce(1, i, 2, dtype, op));
        }
      }
    }
  }
}

TEST_F(Nccl, AllGatherAndBroadcastMoveEveryDtype) {
  for (DType dtype :
       {DType::kFloat32, DType::kBFloat16, DType::kFloat8E4M3, DType::kFloat8E5M2, DType::kInt32}) {
    for (int64_t n : kSizes) {
      Tensor in = copy_to(testing::make_input(dtype, n, 0, 3), kGpu);
      Tensor out(dtype, Shape{n}, kGpu);
      comm_->all_gather(in, out, stream());
      Tensor buf = copy_to(testing::make_input(dtype, n, 0, 4), kGpu);
      comm_->broadcast(buf, 0, stream());
      const Tensor gathered = copy_to(out, Device::host());
      const Tensor broadcast = copy_to(buf, Device::host());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(testing::load(gathered, i),
                  testing::roundtrip(testing::input_value(0, i, 3, dtype), dtype));
        ASSERT_EQ(testing::load(broadcast, i),
                  testing::roundtrip(testing::input_value(0, i, 4, dtype), dtype));
      }
    }
  }
}

// The work's event is recorded on the caller's stream: once the stream has drained (a copy
// enqueued after the operation included), test() reports completion.
TEST_F(Nccl, AsyncWorkCompletesWithItsStream) {
  Tensor buf = copy_to(testing::make_input(DType::kFloat32, 256, 0, 5), kGpu);
  std::vector<float> host(256);
  WorkHandle work = comm_->all_reduce_async(buf, ReduceOp::kSum, stream());
  copy_bytes_async(host.data(), Device::host(), buf.data(), kGpu, buf.nbytes(), stream());
  synchronize(kGpu, stream());
  EXPECT_TRUE(work->test());
  work->wait();
  for (int64_t i = 0; i < 256; ++i) {
    ASSERT_EQ(host[i], testing::input_value(0, i, 5, DType::kFloat32));
  }
}

TEST_F(Nccl, SplitBarrierHostIds) {
  EXPECT_EQ(comm_->backend_name(), "nccl");
  EXPECT_TRUE(comm_->stream_ordered());
  EXPECT_EQ(comm_->one_sided(), nullptr);
  comm_->barrier();
  auto sub = comm_->split(3, 0);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  Tensor buf = copy_to(testing::make_input(DType::kFloat32, 9, 0, 6), kGpu);
  sub->all_reduce(buf, ReduceOp::kMax, stream());
  EXPECT_EQ(comm_->split(-1, 0), nullptr);
  EXPECT_EQ(comm_->host_ids(), std::vector<int>{0});
}

TEST_F(Nccl, BadArgumentsAreErrors) {
  Tensor host(DType::kFloat32, Shape{4});
  Tensor dev(DType::kFloat32, Shape{4}, kGpu);
  Tensor fp8(DType::kFloat8E4M3, Shape{4}, kGpu);
  EXPECT_QMESH_ERROR(comm_->all_reduce_async(host, ReduceOp::kSum), "carries buffers of cuda:0");
  EXPECT_QMESH_ERROR(comm_->all_reduce_async(fp8, ReduceOp::kSum), "reductions support");
  EXPECT_QMESH_ERROR(comm_->all_gather_async(dev, host),
                     "all_gather output must be on cuda:0, got host");
  EXPECT_QMESH_ERROR(comm_->reduce_scatter_async(dev, host, ReduceOp::kSum),
                     "reduce_scatter output must be on cuda:0, got host");
  EXPECT_QMESH_ERROR(comm_->broadcast_async(dev, 1), "broadcast root 1 is out of range");
  EXPECT_QMESH_ERROR(comm_->send_async(dev, 0, 0), "NCCL cannot send to itself");
  EXPECT_QMESH_ERROR(comm_->recv_async(dev, 1, 0), "receive peer 1 is out of range");
  EXPECT_QMESH_ERROR(comm_->send_async(dev, 0, 40000), "tag 40000 is out of range");
}

}  // namespace
}  // namespace qmesh
