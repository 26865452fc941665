// The MPI backend under mpirun: the collective suite that the local backend passes, plus
// MPI specifics (timeouts that withdraw receives, host ids, the bootstrap, a mesh).
#include <gtest/gtest.h>

#include <cstdlib>

#include "collective_suite.h"
#include "expect_error.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/comm/mpi.h"

namespace qmesh {
namespace {

std::shared_ptr<Communicator> world() {
  static std::shared_ptr<Communicator> w = make_mpi_world();
  return w;
}

TEST(Mpi, CollectiveSuite) {
  EXPECT_EQ(world()->backend_name(), "mpi");
  EXPECT_GE(world()->max_tag(), 32767);
  testing::run_collective_suite(*world());
}

TEST(Mpi, ReceiveWithoutSenderTimesOutAndTheCommunicatorStaysUsable) {
  auto& comm = *world();
  float x = 0;
  const auto start = std::chrono::steady_clock::now();
  WorkHandle w = comm.recv_async(TensorView(&x, DType::kFloat32, Shape{1}),
                                 (comm.rank() + 1) % comm.size(), 999);
  EXPECT_QMESH_ERROR(w->wait(std::chrono::milliseconds(200)), "the receive was withdrawn");
  // The error names the peer and the tag.
  w = comm.recv_async(TensorView(&x, DType::kFloat32, Shape{1}), (comm.rank() + 1) % comm.size(),
                      998);
  EXPECT_QMESH_ERROR(
      w->wait(std::chrono::milliseconds(50)),
      detail::concat("peer rank ", (comm.rank() + 1) % comm.size(), " sent nothing with tag 998"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  comm.barrier();
  testing::check_all_reduce(comm, DType::kFloat32, 10, ReduceOp::kSum);
}

// A communicator's timeout (200 ms, set in code; QMESH_COMM_TIMEOUT_S is 5 s in these tests)
// bounds the blocking forms, is named in the error and is inherited by split.
TEST(Mpi, CommunicatorTimeoutIsInheritedBySplitAndBoundsWaits) {
  auto& comm = *world();
  comm.set_timeout(std::chrono::milliseconds(200));
  auto part = comm.split(0, comm.rank());
  comm.set_timeout(std::nullopt);
  EXPECT_EQ(comm.timeout_source(), TimeoutSource::kEnvironment);
  EXPECT_EQ(part->timeout(), std::chrono::milliseconds(200));
  float x = 0;
  const int next = (part->rank() + 1) % part->size();
  EXPECT_QMESH_ERROR(
      part->recv(TensorView(&x, DType::kFloat32, Shape{1}), next, 997),
      detail::concat("timed out after 0.2 s (the communicator's timeout): peer rank ", next,
                     " sent nothing with tag 997"));
  part->set_timeout(std::nullopt);  // the barrier waits as long as the variable says
  part->barrier();
}

TEST(Mpi, DeviceBuffersAreRejected) {
  float x = 0;
  EXPECT_QMESH_ERROR(
      world()->all_reduce_async(TensorView(&x, DType::kFloat32, Shape{1}, Device::cuda(0)),
                                ReduceOp::kSum),
      "the MPI backend carries host buffers");
}

TEST(Mpi, HostIdsOfOneMachine) {
  EXPECT_EQ(world()->host_ids(), std::vector<int>(world()->size(), 0));
}

TEST(Mpi, BootstrapAllGather) {
  auto boot = make_mpi_bootstrap();
  EXPECT_EQ(boot->size(), world()->size());
  const auto all = boot->all_gather("rank-" + std::to_string(boot->rank()));
  for (int r = 0; r < boot->size(); ++r) EXPECT_EQ(all[r], "rank-" + std::to_string(r));
  EXPECT_EQ(boot->broadcast(boot->rank() == 1 ? "id" : "", 1), "id");
}

TEST(Mpi, MeshOverMpi) {
  ASSERT_EQ(world()->size(), 4);
  Mesh mesh(world(), {{"dp", 2}, {"tp", 2}});
  const int r = world()->rank();
  int32_t v = r;
  mesh.axis("tp")->all_reduce(TensorView(&v, DType::kInt32, Shape{1}), ReduceOp::kSum);
  EXPECT_EQ(v, (r / 2) * 4 + 1);  // {0,1} -> 1, {2,3} -> 5
  v = r;
  mesh.axis("dp")->all_reduce(TensorView(&v, DType::kInt32, Shape{1}), ReduceOp::kSum);
  EXPECT_EQ(v, 2 * (r % 2) + 2);  // {0,2} -> 2, {1,3} -> 4
  EXPECT_EQ(mesh.amax_group()->size(), 4);
  EXPECT_FALSE(mesh.axis_spans_hosts("tp"));
}

}  // namespace
}  // namespace qmesh
