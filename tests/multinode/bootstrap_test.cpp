// Run across two nscluster nodes with 2 ranks each (multinode_test.sh, case bootstrap): what
// multi-node NCCL needs from the application, tested on the host. make_nccl_world sends rank
// 0's ncclUniqueId (NCCL_UNIQUE_ID_BYTES = 128 opaque bytes) with Bootstrap::broadcast; here
// a 128-byte value holding every kind of byte (zeros included) goes through the MPI
// bootstrap and through a StoreBootstrap over a FileStore on the file system the nodes
// share, and each rank compares it with the bytes of a plain MPI_Bcast. The mesh sees the
// two hosts (ranks {0,1} and {2,3}) and a tp axis of 2 inside a host.
//
// usage (under mpirun, 4 ranks): multinode_bootstrap_test
#include "qmesh/comm/bootstrap.h"

#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "qmesh/comm/mesh.h"
#include "qmesh/comm/mpi.h"

namespace qmesh {
namespace {

// A fresh directory made by rank 0 on the file system the nodes share; its path via MPI.
std::string shared_store_dir() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  std::string dir(4096, '\0');
  if (rank == 0) {
    char name[] = "/tmp/qmesh-store.XXXXXX";
    if (mkdtemp(name) != nullptr) dir.replace(0, sizeof(name), name, sizeof(name));
  }
  MPI_Bcast(dir.data(), int(dir.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  dir.resize(dir.find('\0'));
  return dir;
}

// Rank 0's id-sized value, as every rank must receive it: rank 0 draws it, MPI_Bcast carries it.
std::string reference_id() {
  std::string id(128, '\0');
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::mt19937 gen(std::random_device{}());
    for (size_t i = 0; i < id.size(); ++i) id[i] = char(i % 4 == 0 ? 0 : gen() & 0xff);
  }
  MPI_Bcast(id.data(), int(id.size()), MPI_CHAR, 0, MPI_COMM_WORLD);
  return id;
}

TEST(MultiNodeBootstrap, UniqueIdOverMpi) {
  const std::string expected = reference_id();
  auto boot = make_mpi_bootstrap();
  ASSERT_EQ(boot->size(), 4) << "run with 4 ranks";
  const std::string got = boot->broadcast(boot->rank() == 0 ? expected : std::string(), 0);
  EXPECT_EQ(got, expected);
}

TEST(MultiNodeBootstrap, UniqueIdOverFileStore) {
  const std::string expected = reference_id();
  const std::string dir = shared_store_dir();
  ASSERT_FALSE(dir.empty()) << "rank 0 could not create a directory under /tmp";
  auto world = make_mpi_world();
  StoreBootstrap boot(std::make_shared<FileStore>(dir), world->rank(), world->size(), "nccl-id");
  const std::string got = boot.broadcast(boot.rank() == 0 ? expected : std::string(), 0);
  EXPECT_EQ(got, expected);
  // Every rank's host name, through the store: two distinct nodes, two ranks each.
  const std::vector<std::string> hosts = boot.all_gather(host_name());
  EXPECT_EQ(number_hosts(hosts), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_NE(hosts[0], hosts[2]);
  MPI_Barrier(MPI_COMM_WORLD);  // every rank has read the store before rank 0 removes it
  if (world->rank() == 0) std::filesystem::remove_all(dir);
}

TEST(MultiNodeBootstrap, MeshSeesTwoHosts) {
  auto world = make_mpi_world();
  Mesh mesh(world, {{"dp", 2}, {"tp", 2}});
  EXPECT_EQ(mesh.host_ids(), (std::vector<int>{0, 0, 1, 1}));
  EXPECT_FALSE(mesh.axis_spans_hosts("tp"));
  EXPECT_TRUE(mesh.axis_spans_hosts("dp"));
}

}  // namespace
}  // namespace qmesh
