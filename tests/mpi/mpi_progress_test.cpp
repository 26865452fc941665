// Background progress of the MPI backend (2 ranks): a large message posted before a long
// computation arrives while the receiver computes and makes no MPI call, so that transfers
// really run behind GEMMs. The message is far above every eager limit of Open MPI's
// transports, so without background progress the data would only move in the final wait.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "qmesh/comm/mpi.h"

namespace qmesh {
namespace {

constexpr int64_t kBytes = 32 << 20;

uint8_t pattern(int64_t i) { return static_cast<uint8_t>((i * 7 + 13) % 251 + 1); }  // never 0

TEST(MpiProgress, LargeMessageArrivesWhileTheReceiverMakesNoMpiCall) {
  static const auto world = make_mpi_world();
  ASSERT_EQ(world->size(), 2) << "run with mpirun -np 2";
  std::vector<uint8_t> buf(kBytes, 0);
  // Raw bytes (any 1-byte dtype: send/recv move bytes).
  const TensorView view(buf.data(), DType::kFloat8E4M3, Shape{kBytes});
  if (world->rank() == 0) {
    for (int64_t i = 0; i < kBytes; ++i) buf[i] = pattern(i);
    world->send(view, 1, 7);
    return;
  }
  WorkHandle recv = world->recv_async(view, 0, 7);
  // The "computation": watch the last bytes of the buffer without calling MPI. The deadline
  // only keeps a broken build from hanging; the test fails if the data never shows up.
  const volatile uint8_t* tail = buf.data() + kBytes - 64;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  bool arrived = false;
  while (!arrived && std::chrono::steady_clock::now() < deadline) {
    arrived = true;
    for (int64_t i = 0; i < 64; ++i) arrived = arrived && tail[i] == pattern(kBytes - 64 + i);
  }
  EXPECT_TRUE(arrived) << "the message did not arrive until the receiver called MPI "
                          "(is QMESH_MPI_PROGRESS_THREAD=0, or MPI not thread-multiple?)";
  recv->wait();
  for (int64_t i = 0; i < kBytes; i += 4099) ASSERT_EQ(buf[i], pattern(i)) << "byte " << i;
}

}  // namespace
}  // namespace qmesh
