// The UCX backend under mpirun (MPI only launches the ranks and carries the bootstrap): the
// shared collective suite, one-sided puts, progress that does not need the target's help,
// the mesh over UCX, errors and timeouts. ctest runs it once per UCX_TLS setting.
#include "qmesh/comm/ucx.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "collective_suite.h"
#include "expect_error.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/comm/one_sided.h"
#include "test_world.h"

namespace qmesh {
namespace {

using std::chrono::milliseconds;

using testing_world::world;  // UCX: ctest runs this test with QMESH_TEST_WORLD=ucx

TEST(UcxMpi, IsAUcxCommunicatorWithOneSided) {
  EXPECT_EQ(world()->backend_name(), "ucx");
  EXPECT_EQ(world()->size(), 4);
  EXPECT_NE(world()->one_sided(), nullptr);
  EXPECT_EQ(world()->max_tag(), 0x7fffffff);
}

TEST(UcxMpi, CollectiveSuite) { testing::run_collective_suite(*world()); }

TEST(UcxMpi, HostIdsAreOneHost) {
  EXPECT_EQ(world()->host_ids(), std::vector<int>(world()->size(), 0));
}

TEST(UcxMpi, MeshAxesAndGroups) {
  Communicator& w = *world();
  Mesh mesh(world(), {{"dp", 2}, {"tp", 2}});
  EXPECT_EQ(mesh.axis("tp")->backend_name(), "ucx");
  // tp groups are {0,1} and {2,3}; dp groups {0,2} and {1,3}.
  int32_t tp_sum = w.rank();
  mesh.axis("tp")->all_reduce(TensorView(&tp_sum, DType::kInt32, Shape{1}), ReduceOp::kSum);
  EXPECT_EQ(tp_sum, w.rank() < 2 ? 0 + 1 : 2 + 3);
  int32_t dp_max = w.rank();
  mesh.axis("dp")->all_reduce(TensorView(&dp_max, DType::kInt32, Shape{1}), ReduceOp::kMax);
  EXPECT_EQ(dp_max, 2 + w.rank() % 2);
  EXPECT_EQ(mesh.amax_group()->size(), 4);
}

// Windows of different sizes: rank p registers (p + 1) * kN floats, and every rank r <= p
// puts its block into slot r of rank p's window.
TEST(UcxMpi, PutsIntoWindowsOfDifferentSizes) {
  constexpr int64_t kN = 129;
  Communicator& w = *world();
  const int r = w.rank();
  std::vector<float> buf((r + 1) * kN, -1.0f);
  auto window = w.one_sided()->register_window(
      TensorView(buf.data(), DType::kFloat32, Shape{static_cast<int64_t>(buf.size())}));
  std::vector<std::vector<float>> blocks;
  std::vector<WorkHandle> puts;
  for (int p = r; p < w.size(); ++p) {
    EXPECT_EQ(window->peer_bytes(p), (p + 1) * kN * sizeof(float));
    blocks.emplace_back(kN);
    for (int64_t i = 0; i < kN; ++i) blocks.back()[i] = r * 1000.0f + p * 100.0f + i;
    puts.push_back(
        w.one_sided()->put_async(*window, p, r * kN * sizeof(float),
                                 TensorView(blocks.back().data(), DType::kFloat32, Shape{kN})));
  }
  for (auto& put : puts) put->wait();
  window->wait_puts(r + 1);
  for (int s = 0; s <= r; ++s) {
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(buf[s * kN + i], s * 1000.0f + r * 100.0f + i) << "slot " << s << " element " << i;
    }
  }
  w.barrier();  // nobody puts into a window after it is gone
}

// Many small puts in flight at once; the target's counter counts every one of them.
TEST(UcxMpi, ManyPutsAreCountedOneByOne) {
  constexpr int kPuts = 200;
  Communicator& w = *world();
  std::vector<int32_t> slots(kPuts, -1);
  auto window =
      w.one_sided()->register_window(TensorView(slots.data(), DType::kInt32, Shape{kPuts}));
  const int next = (w.rank() + 1) % w.size();
  std::vector<int32_t> values(kPuts);
  std::vector<WorkHandle> puts;
  for (int i = 0; i < kPuts; ++i) {
    values[i] = w.rank() * 10000 + i;
    puts.push_back(w.one_sided()->put_async(*window, next, i * sizeof(int32_t),
                                            TensorView(&values[i], DType::kInt32, Shape{1})));
  }
  window->wait_puts(kPuts / 2);
  window->wait_puts(kPuts - kPuts / 2);
  for (auto& put : puts) put->wait();
  const int prev = (w.rank() + w.size() - 1) % w.size();
  for (int i = 0; i < kPuts; ++i) ASSERT_EQ(slots[i], prev * 10000 + i) << "slot " << i;
  // Every arrival was consumed: one more wait times out.
  EXPECT_QMESH_ERROR(window->wait_puts(1, milliseconds(50)), "timed out");
  w.barrier();
}

// The backend progresses on its own: a put into a rank that is busy elsewhere (not calling
// qmesh at all) completes long before that rank comes back.
TEST(UcxMpi, PutCompletesWhileTheTargetComputes) {
  constexpr auto kBusy = milliseconds(1500);
  Communicator& w = *world();
  std::vector<double> buf(4096, 0.0);
  auto window = w.one_sided()->register_window(
      TensorView(buf.data(), DType::kFloat64, Shape{static_cast<int64_t>(buf.size())}));
  if (w.rank() == 1) {
    std::this_thread::sleep_for(kBusy);  // "computing": no qmesh call
    window->wait_puts(1, milliseconds(0));
    for (size_t i = 0; i < buf.size(); ++i) ASSERT_EQ(buf[i], 0.5 * i);
  } else if (w.rank() == 0) {
    std::vector<double> src(buf.size());
    for (size_t i = 0; i < src.size(); ++i) src[i] = 0.5 * i;
    const auto start = std::chrono::steady_clock::now();
    w.one_sided()
        ->put_async(
            *window, 1, 0,
            TensorView(src.data(), DType::kFloat64, Shape{static_cast<int64_t>(src.size())}))
        ->wait();
    EXPECT_LT(std::chrono::steady_clock::now() - start, kBusy / 2)
        << "the put waited for the target to call into qmesh";
  }
  w.barrier();
}

TEST(UcxMpi, BadArgumentsAreErrors) {
  Communicator& w = *world();
  float x[8] = {};
  TensorView four(x, DType::kFloat32, Shape{4});
  TensorView on_gpu(x, DType::kFloat32, Shape{4}, Device::cuda(0));
  EXPECT_QMESH_ERROR(w.all_reduce_async(on_gpu, ReduceOp::kSum), "carry host buffers");
  EXPECT_QMESH_ERROR(w.send_async(on_gpu, 0, 0), "carry host buffers");
  EXPECT_QMESH_ERROR(w.send_async(four, 4, 0), "send peer 4 is out of range");
  EXPECT_QMESH_ERROR(w.recv_async(four, 0, -1), "tag -1 is out of range");
  EXPECT_QMESH_ERROR(w.all_gather_async(four, four), "all_gather output has 4 elements");
  EXPECT_QMESH_ERROR(w.broadcast_async(four, 4), "broadcast root 4 is out of range");
  auto window = w.one_sided()->register_window(four);
  EXPECT_QMESH_ERROR(w.one_sided()->put_async(*window, 0, 8, four), "overruns the window buffer");
  EXPECT_QMESH_ERROR(w.one_sided()->put_async(*window, 5, 0, four), "put peer 5 is out of range");
  auto other = w.split(0, w.rank());
  EXPECT_QMESH_ERROR(other->one_sided()->put_async(*window, 0, 0, four),
                     "not registered on this UCX communicator");
  w.barrier();
}

TEST(UcxMpi, SizeMismatchIsAnErrorAtTheReceiver) {
  Communicator& w = *world();
  float x[8] = {};
  if (w.rank() == 0) {
    w.send(TensorView(x, DType::kFloat32, Shape{4}), 1, 3);
    w.send(TensorView(x, DType::kFloat32, Shape{8}), 1, 4);
  } else if (w.rank() == 1) {
    EXPECT_QMESH_ERROR(w.recv(TensorView(x, DType::kFloat32, Shape{8}), 0, 3),
                       "the message has 16 bytes but the receive buffer has 32");
    EXPECT_QMESH_ERROR(w.recv(TensorView(x, DType::kFloat32, Shape{4}), 0, 4),
                       "the message has more bytes but the receive buffer has 16");
  }
  w.barrier();
}

TEST(UcxMpi, WaitsTimeOut) {
  Communicator& w = *world();
  float x[4] = {};
  TensorView four(x, DType::kFloat32, Shape{4});
  if (w.rank() == 1) {
    // Rank 0 sends only after this wait has given up; the destroyed work then waits for it.
    EXPECT_QMESH_ERROR(w.recv_async(four, 0, 77)->wait(milliseconds(200)),
                       "ucx receive of 16 bytes on rank 1 from rank 0 (tag 77) timed out");
  } else if (w.rank() == 0) {
    std::this_thread::sleep_for(milliseconds(600));
    w.send(four, 1, 77);
  }
  auto window = w.one_sided()->register_window(four);
  EXPECT_QMESH_ERROR(window->wait_puts(1, milliseconds(100)), "0 of 1 expected puts arrived");
  w.barrier();
}

// A communicator's timeout (200 ms, set in code; QMESH_COMM_TIMEOUT_S is 5 s in these tests)
// is inherited by split and bounds its waits; the error names it.
TEST(UcxMpi, CommunicatorTimeoutIsInheritedBySplitAndBoundsWaits) {
  Communicator& w = *world();
  w.set_timeout(milliseconds(200));
  auto part = w.split(0, w.rank());
  w.set_timeout(std::nullopt);
  EXPECT_EQ(part->timeout(), milliseconds(200));
  float x[4] = {};
  TensorView four(x, DType::kFloat32, Shape{4});
  if (part->rank() == 1) {
    // Rank 0 sends only after this wait has given up (the receive stays posted and takes it).
    EXPECT_QMESH_ERROR(part->recv(four, 0, 78),
                       "timed out after 0.2 s (the communicator's timeout): peer rank 0 sent "
                       "nothing with tag 78");
  } else if (part->rank() == 0) {
    std::this_thread::sleep_for(milliseconds(600));
    part->set_timeout(std::nullopt);
    part->send(four, 1, 78);
  }
  part->set_timeout(std::nullopt);  // the barrier waits as long as the variable says
  part->barrier();
}

}  // namespace
}  // namespace qmesh
