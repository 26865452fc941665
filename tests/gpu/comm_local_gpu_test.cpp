// The local backend on CUDA buffers: several virtual ranks (threads) on one GPU, each with
// its own stream, against the same float64 references as the host suite. Skipped without
// a GPU.
#include <gtest/gtest.h>

#include "collective_suite.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/one_sided.h"
#include "qmesh/copy.h"
#include "qmesh/owned_stream.h"

namespace qmesh {
namespace {

class GpuRank {
 public:
  Stream stream() const { return owned_.get(); }
  // A device copy of a host tensor.
  static Tensor to_device(const Tensor& host) { return clone(host, Device::cuda(0)); }
  static Tensor to_host(const Tensor& device) { return clone(device, Device::host()); }

 private:
  OwnedStream owned_{Device::cuda(0)};
};

class LocalGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(LocalGpu, CollectivesOnDeviceBuffers) {
  constexpr int64_t kN = 1000;
  for (int ranks : {1, 2, 4}) {
    run_local_ranks(ranks, [](Communicator& comm) {
      GpuRank me;
      const int n = comm.size(), r = comm.rank();
      for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
        Tensor buf = GpuRank::to_device(testing::make_input(dtype, kN, r, 1));
        comm.all_reduce(buf, ReduceOp::kSum, me.stream());
        Tensor got = GpuRank::to_host(buf);
        for (int64_t i = 0; i < kN; ++i) {
          ASSERT_EQ(testing::load(got, i),
                    testing::reference_reduce(n, i, 1, dtype, ReduceOp::kSum));
        }
        Tensor in = GpuRank::to_device(testing::make_input(dtype, kN * n, r, 2));
        Tensor out(dtype, Shape{kN}, Device::cuda(0));
        comm.reduce_scatter(in, out, ReduceOp::kMax, me.stream());
        got = GpuRank::to_host(out);
        for (int64_t i = 0; i < kN; ++i) {
          ASSERT_EQ(testing::load(got, i),
                    testing::reference_reduce(n, r * kN + i, 2, dtype, ReduceOp::kMax));
        }
        Tensor mine = GpuRank::to_device(testing::make_input(dtype, kN, r, 3));
        Tensor all(dtype, Shape{kN * n}, Device::cuda(0));
        comm.all_gather(mine, all, me.stream());
        got = GpuRank::to_host(all);
        for (int q = 0; q < n; ++q) {
          for (int64_t i = 0; i < kN; ++i) {
            ASSERT_EQ(testing::load(got, q * kN + i), testing::input_value(q, i, 3, dtype));
          }
        }
      }
    });
  }
}

TEST_F(LocalGpu, PointToPointAndPutsBetweenDeviceBuffers) {
  constexpr int64_t kN = 4096;
  run_local_ranks(2, [](Communicator& comm) {
    GpuRank me;
    const int r = comm.rank(), peer = 1 - r;
    Tensor send = GpuRank::to_device(testing::make_input(DType::kFloat32, kN, r, 5));
    Tensor recv(DType::kFloat32, Shape{kN}, Device::cuda(0));
    WorkHandle rw = comm.recv_async(recv, peer, 7, me.stream());
    WorkHandle sw = comm.send_async(send, peer, 7, me.stream());
    sw->wait();
    rw->wait();
    Tensor got = GpuRank::to_host(recv);
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(testing::load(got, i), testing::input_value(peer, i, 5, DType::kFloat32));
    }
    Tensor window_buf(DType::kFloat32, Shape{kN}, Device::cuda(0));
    auto window = comm.one_sided()->register_window(window_buf);
    comm.one_sided()->put_async(*window, peer, 0, send, me.stream())->wait();
    window->wait_puts(1);
    got = GpuRank::to_host(window_buf);
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(testing::load(got, i), testing::input_value(peer, i, 5, DType::kFloat32));
    }
    comm.barrier();
  });
}

}  // namespace
}  // namespace qmesh
