// Bootstrap: the file store and all-gathers over a store and over a communicator.
#include "qmesh/comm/bootstrap.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "expect_error.h"
#include "qmesh/comm/local.h"

namespace qmesh {
namespace {

std::filesystem::path fresh_dir(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() /
             ("qmesh_store_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  return dir;
}

TEST(FileStore, SetThenGetAndReplace) {
  FileStore store(fresh_dir("set"));
  store.set("a.b-c_1", std::string("x\0y", 3));
  EXPECT_EQ(store.get("a.b-c_1"), std::string("x\0y", 3));
  store.set("a.b-c_1", "");
  EXPECT_EQ(store.get("a.b-c_1"), "");
}

TEST(FileStore, GetWaitsForALaterSet) {
  FileStore store(fresh_dir("wait"));
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    store.set("late", "value");
  });
  EXPECT_EQ(store.get("late", std::chrono::seconds(10)), "value");
  writer.join();
}

TEST(FileStore, MissingKeyTimesOutAndBadKeysAreErrors) {
  FileStore store(fresh_dir("bad"));
  EXPECT_QMESH_ERROR(store.get("never", std::chrono::milliseconds(30)),
                     "file store key 'never' did not appear");
  EXPECT_QMESH_ERROR(store.set("a/b", "x"), "store key 'a/b' must be");
  EXPECT_QMESH_ERROR(store.set("", "x"), "store key '' must be");
}

TEST(StoreBootstrap, AllGatherAndBroadcastAcrossThreads) {
  constexpr int kRanks = 5;
  auto store = std::make_shared<FileStore>(fresh_dir("boot"));
  std::vector<std::thread> threads;
  std::vector<std::vector<std::string>> got(kRanks);
  std::vector<std::string> bcast(kRanks);
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      StoreBootstrap boot(store, r, kRanks, "job1");
      got[r] = boot.all_gather(std::string(r, 'a' + r));
      bcast[r] = boot.broadcast(r == 3 ? "unique-id" : "ignored", 3);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(got[r].size(), static_cast<size_t>(kRanks));
    for (int q = 0; q < kRanks; ++q) EXPECT_EQ(got[r][q], std::string(q, 'a' + q));
    EXPECT_EQ(bcast[r], "unique-id");
  }
}

TEST(StoreBootstrap, BadArgumentsAndMissingRanks) {
  auto store = std::make_shared<FileStore>(fresh_dir("args"));
  EXPECT_QMESH_ERROR(StoreBootstrap(store, 2, 2), "bootstrap rank 2 is out of range [0, 2)");
  EXPECT_QMESH_ERROR(StoreBootstrap(nullptr, 0, 1), "needs a store");
  StoreBootstrap alone(store, 0, 2, "lonely");
  EXPECT_QMESH_ERROR(alone.all_gather("x", std::chrono::milliseconds(30)),
                     "bootstrap all_gather (rank 0 of 2): peer rank 1 never joined this "
                     "all_gather (file store key 'lonely.0.1' did not appear");
}

TEST(CommBootstrap, AllGatherOverALocalWorld) {
  run_local_ranks(3, [](Communicator& comm) {
    auto boot = make_comm_bootstrap(comm.split(0, comm.rank()));
    EXPECT_EQ(boot->rank(), comm.rank());
    const auto all = boot->all_gather(std::string(comm.rank() * 5 + 1, '0' + comm.rank()));
    for (int r = 0; r < 3; ++r) EXPECT_EQ(all[r], std::string(r * 5 + 1, '0' + r));
  });
}

TEST(Hosts, NumberedInOrderOfFirstAppearance) {
  EXPECT_EQ(number_hosts({"b", "a", "b", "c", "a"}), (std::vector<int>{0, 1, 0, 2, 1}));
  EXPECT_FALSE(host_name().empty());
}

}  // namespace
}  // namespace qmesh
