// One-sided puts on the local backend: every rank writes its slice into every peer's
// window, counters release the targets, bounds are checked and waits time out.
#include "qmesh/comm/one_sided.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "expect_error.h"
#include "qmesh/comm/local.h"

namespace qmesh {
namespace {

TEST(OneSided, AllToAllPutsLandAtTheirOffsets) {
  constexpr int64_t kN = 33;
  for (int size : {1, 2, 5}) {
    run_local_ranks(size, [](Communicator& comm) {
      OneSided* os = comm.one_sided();
      ASSERT_NE(os, nullptr);
      std::vector<float> window_buf(kN * comm.size(), -1.0f);
      auto window = os->register_window(
          TensorView(window_buf.data(), DType::kFloat32, Shape{kN * comm.size()}));
      EXPECT_EQ(window->local().data, window_buf.data());
      std::vector<float> mine(kN);
      for (int64_t i = 0; i < kN; ++i) mine[i] = comm.rank() * 1000.0f + i;
      std::vector<WorkHandle> puts;
      for (int p = 0; p < comm.size(); ++p) {
        EXPECT_EQ(window->peer_bytes(p), kN * comm.size() * sizeof(float));
        puts.push_back(os->put_async(*window, p, comm.rank() * kN * sizeof(float),
                                     TensorView(mine.data(), DType::kFloat32, Shape{kN})));
      }
      for (auto& w : puts) w->wait();
      window->wait_puts(comm.size());
      for (int r = 0; r < comm.size(); ++r) {
        for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(window_buf[r * kN + i], r * 1000.0f + i);
      }
      comm.barrier();  // no peer may put into the window after it is gone
    });
  }
}

// A ring in the style of the collective-GEMM schedules: at step s each rank forwards the
// chunk it received at step s-1 into its right neighbour's slot for that chunk.
TEST(OneSided, RingForwardingWithCounters) {
  constexpr int kRanks = 4;
  constexpr int64_t kN = 16;
  run_local_ranks(kRanks, [](Communicator& comm) {
    const int r = comm.rank();
    std::vector<int32_t> slots(kN * kRanks, 0);
    for (int64_t i = 0; i < kN; ++i) slots[r * kN + i] = r * 100 + static_cast<int32_t>(i);
    auto window = comm.one_sided()->register_window(
        TensorView(slots.data(), DType::kInt32, Shape{kN * kRanks}));
    const int next = (r + 1) % kRanks;
    for (int s = 0; s < kRanks - 1; ++s) {
      const int chunk = (r - s + kRanks) % kRanks;
      comm.one_sided()
          ->put_async(*window, next, chunk * kN * sizeof(int32_t),
                      TensorView(slots.data() + chunk * kN, DType::kInt32, Shape{kN}))
          ->wait();
      window->wait_puts(1);  // the chunk of step s from the left neighbour has arrived
    }
    for (int c = 0; c < kRanks; ++c) {
      for (int64_t i = 0; i < kN; ++i) ASSERT_EQ(slots[c * kN + i], c * 100 + i);
    }
    comm.barrier();
  });
}

TEST(OneSided, OutOfBoundsPutIsAnError) {
  run_local_ranks(2, [](Communicator& comm) {
    float buf[4] = {};
    auto window = comm.one_sided()->register_window(TensorView(buf, DType::kFloat32, Shape{4}));
    float src[2] = {};
    EXPECT_QMESH_ERROR(comm.one_sided()->put_async(*window, 1 - comm.rank(), 12,
                                                   TensorView(src, DType::kFloat32, Shape{2})),
                       "overruns the window buffer");
    EXPECT_QMESH_ERROR(
        comm.one_sided()->put_async(*window, 2, 0, TensorView(src, DType::kFloat32, Shape{2})),
        "put peer 2 is out of range");
    comm.barrier();
  });
}

TEST(OneSided, WaitForPutsThatNeverComeTimesOut) {
  run_local_ranks(2, [](Communicator& comm) {
    float buf[4] = {};
    auto window = comm.one_sided()->register_window(TensorView(buf, DType::kFloat32, Shape{4}));
    EXPECT_QMESH_ERROR(window->wait_puts(1, std::chrono::milliseconds(100)), "timed out");
    comm.barrier();
  });
}

}  // namespace
}  // namespace qmesh
