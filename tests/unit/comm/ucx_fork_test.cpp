// The UCX backend without MPI: ranks are forked processes that find each other through a
// FileStore in a fresh directory (how launchers without MPI bootstrap), then run the shared
// collective suite and a ring of one-sided puts.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>
#include <vector>

#include "collective_suite.h"
#include "qmesh/comm/one_sided.h"
#include "qmesh/comm/ucx.h"

namespace qmesh {
namespace {

// Runs in a forked child: its exit status tells the parent whether every check passed.
int run_rank(const std::filesystem::path& dir, int rank, int size) {
  try {
    StoreBootstrap bootstrap(std::make_shared<FileStore>(dir), rank, size, "ucx_fork");
    auto world = make_ucx_world(bootstrap);
    testing::run_collective_suite(*world);
    // Each rank puts its rank number into slot `rank` of the next rank's window.
    std::vector<int32_t> slots(size, -1);
    auto window =
        world->one_sided()->register_window(TensorView(slots.data(), DType::kInt32, Shape{size}));
    int32_t mine = rank;
    world->one_sided()
        ->put_async(*window, (rank + 1) % size, rank * sizeof(int32_t),
                    TensorView(&mine, DType::kInt32, Shape{1}))
        ->wait();
    window->wait_puts(1);
    const int prev = (rank + size - 1) % size;
    EXPECT_EQ(slots[prev], prev);
    world->barrier();
    return ::testing::Test::HasFailure() ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    return 2;
  }
}

TEST(UcxFileStore, ForkedRanksRunTheSuite) {
  constexpr int kRanks = 3;
  constexpr auto kLimit = std::chrono::seconds(120);
  // TCP over loopback unless the caller chose transports: the puts below are unreliable with
  // UCX 1.13's shared-memory transports under load (docs/design/comm.md, "Known problem").
  setenv("UCX_TLS", "tcp,self", 0);
  setenv("UCX_NET_DEVICES", "lo", 0);
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("qmesh_ucx_fork_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::vector<pid_t> children;
  for (int r = 0; r < kRanks; ++r) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) _exit(run_rank(dir, r, kRanks));
    children.push_back(pid);
  }
  // Reap every child, killing the stragglers once the limit has passed (never hang).
  const auto deadline = std::chrono::steady_clock::now() + kLimit;
  std::vector<int> statuses(kRanks, -1);
  for (int left = kRanks; left > 0;) {
    for (int r = 0; r < kRanks; ++r) {
      if (statuses[r] != -1) continue;
      int status = 0;
      if (waitpid(children[r], &status, WNOHANG) == children[r]) {
        statuses[r] = status;
        --left;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      for (int r = 0; r < kRanks; ++r) {
        if (statuses[r] == -1) kill(children[r], SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::filesystem::remove_all(dir);
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(WIFEXITED(statuses[r]) && WEXITSTATUS(statuses[r]) == 0)
        << "rank " << r << " ended with wait status " << statuses[r];
  }
}

}  // namespace
}  // namespace qmesh
