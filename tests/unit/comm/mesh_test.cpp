// The mesh: rank <-> coordinates, per-axis and per-group communicators (checked by reducing
// rank numbers over them), roles, topology, and every kind of bad input.
#include "qmesh/comm/mesh.h"

#include <gtest/gtest.h>

#include "expect_error.h"
#include "qmesh/comm/local.h"

namespace qmesh {
namespace {

// Sum of the world ranks of the members of `group` (an independent check of membership).
int32_t sum_of_ranks(Communicator& group, int world_rank) {
  int32_t v = world_rank;
  group.all_reduce(TensorView(&v, DType::kInt32, Shape{1}), ReduceOp::kSum);
  return v;
}

TEST(Mesh, CoordinatesLastAxisFastest) {
  auto one = make_local_world(1);
  Mesh m1(one[0], {{"dp", 1}, {"tp", 1}});
  EXPECT_EQ(m1.coords_of(0), (std::vector<int>{0, 0}));
  run_local_ranks(8, [](Communicator& comm) {
    auto self = comm.split(0, comm.rank());
    Mesh mesh(self, {{"dp", 2}, {"tp", 4}});
    EXPECT_EQ(mesh.coord("dp"), comm.rank() / 4);
    EXPECT_EQ(mesh.coord("tp"), comm.rank() % 4);
    EXPECT_EQ(mesh.coords_of(6), (std::vector<int>{1, 2}));
    EXPECT_EQ(mesh.rank_of({1, 2}), 6);
    EXPECT_EQ(mesh.axis_size("tp"), 4);
  });
}

// A timeout set on the world before the mesh is built holds for every axis, group and role.
TEST(Mesh, CommunicatorsInheritTheWorldsTimeout) {
  run_local_ranks(4, [](Communicator& comm) {
    auto world = comm.split(0, comm.rank());
    world->set_timeout(std::chrono::milliseconds(1234));
    Mesh mesh(world, {{"dp", 2}, {"tp", 2}});
    for (const auto& c : {mesh.axis("dp"), mesh.axis("tp"), mesh.group({"dp", "tp"}),
                          mesh.amax_group(), mesh.role("")}) {
      EXPECT_EQ(c->timeout(), std::chrono::milliseconds(1234));
      EXPECT_EQ(c->timeout_source(), TimeoutSource::kCommunicator);
    }
  });
}

TEST(Mesh, AxisAndGroupCommunicators) {
  run_local_ranks(12, [](Communicator& comm) {
    auto world = comm.split(0, comm.rank());
    Mesh mesh(world, {{"pp", 2}, {"dp", 3}, {"tp", 2}}, MeshResource{.pp = "pp"});
    const int r = comm.rank();
    const int pp = r / 6, dp = (r / 2) % 3, tp = r % 2;
    // tp group: the two ranks 2k, 2k+1.
    auto tp_comm = mesh.axis("tp");
    EXPECT_EQ(tp_comm->size(), 2);
    EXPECT_EQ(tp_comm->rank(), tp);
    EXPECT_EQ(sum_of_ranks(*tp_comm, r), (r - tp) * 2 + 1);
    // dp group: ranks pp*6 + {0,2,4} + tp.
    auto dp_comm = mesh.axis("dp");
    EXPECT_EQ(dp_comm->size(), 3);
    EXPECT_EQ(dp_comm->rank(), dp);
    EXPECT_EQ(sum_of_ranks(*dp_comm, r), 3 * (pp * 6 + tp) + 6);
    // pp group: r and r +- 6.
    EXPECT_EQ(sum_of_ranks(*mesh.axis("pp"), r), 2 * (r % 6) + 6);
    // {dp, tp} = amax group: the 6 ranks of one pipeline stage.
    auto amax = mesh.amax_group();
    EXPECT_EQ(amax->size(), 6);
    EXPECT_EQ(sum_of_ranks(*amax, r), 6 * pp * 6 + 15);
    EXPECT_EQ(mesh.group({"tp", "dp"})->size(), 6);
    EXPECT_EQ(mesh.group({"pp", "tp"})->size(), 4);
    EXPECT_EQ(mesh.group({"pp", "dp", "tp"})->size(), 12);
    EXPECT_EQ(mesh.role(mesh.resource().tp), tp_comm);
    EXPECT_EQ(mesh.role(mesh.resource().fsdp)->size(), 1);
    EXPECT_EQ(mesh.world(), world);
  });
}

TEST(Mesh, RolesDefaultsAndAmaxWithoutPipeline) {
  run_local_ranks(4, [](Communicator& comm) {
    auto world = comm.split(0, comm.rank());
    Mesh plain(world, {{"x", 4}});  // no dp/tp axis: the default role names are dropped
    EXPECT_TRUE(plain.resource().dp.empty());
    EXPECT_TRUE(plain.resource().tp.empty());
    EXPECT_EQ(plain.amax_group()->size(), 4);
    Mesh dp_tp(world, {{"dp", 2}, {"tp", 2}});
    EXPECT_EQ(dp_tp.resource().dp, "dp");
    EXPECT_EQ(dp_tp.resource().tp, "tp");
    EXPECT_EQ(dp_tp.amax_group()->size(), 4);
    EXPECT_FALSE(dp_tp.axis_spans_hosts("tp"));
    Mesh only_pp(world, {{"stage", 4}}, MeshResource{.pp = "stage"});
    EXPECT_EQ(only_pp.amax_group()->size(), 1);
  });
}

TEST(Mesh, BadInputIsAnError) {
  auto comms = make_local_world(4);
  auto w = comms[0];
  EXPECT_QMESH_ERROR(Mesh(w, {{"dp", 2}, {"tp", 3}}),
                     "has 6 ranks but the world communicator has 4");
  EXPECT_QMESH_ERROR(Mesh(w, {{"dp", 1}, {"tp", 2}}), "has 2 ranks but the world");
  EXPECT_QMESH_ERROR(Mesh(w, {{"dp", 2}, {"dp", 2}}), "mesh axis name 'dp' appears twice");
  EXPECT_QMESH_ERROR(Mesh(w, {{"", 4}}), "mesh axis names must be non-empty");
  EXPECT_QMESH_ERROR(Mesh(w, {{"dp", 0}, {"tp", 4}}), "mesh axis 'dp' has size 0");
  EXPECT_QMESH_ERROR(Mesh(w, {{"dp", -4}}), "mesh axis 'dp' has size -4");
  EXPECT_QMESH_ERROR(Mesh(w, {}), "a mesh needs at least one axis");
  EXPECT_QMESH_ERROR(Mesh(nullptr, {{"dp", 4}}), "Mesh needs a world communicator");
  EXPECT_QMESH_ERROR(Mesh(w, {{"dp", 4}}, MeshResource{.pp = "pipe"}),
                     "role pp names axis 'pipe', which the mesh {dp=4} does not have");
  EXPECT_QMESH_ERROR(Mesh(w, {{"dp", 4}}, MeshResource{.fsdp = "dp"}),
                     "roles dp and fsdp both name axis 'dp'");
  EXPECT_QMESH_ERROR(
      Mesh(w, {{"a", 1}, {"b", 1}, {"c", 1}, {"d", 1}, {"e", 1}, {"f", 1}, {"g", 4}}),
      "at most 6 are supported");
}

TEST(Mesh, UnknownAxisIsAnError) {
  auto one = make_local_world(1);
  Mesh mesh(one[0], {{"dp", 1}, {"tp", 1}});
  EXPECT_QMESH_ERROR(mesh.axis("pp"), "mesh {dp=1, tp=1} has no axis named 'pp'");
  EXPECT_QMESH_ERROR(mesh.axis_size("x"), "has no axis named 'x'");
  EXPECT_QMESH_ERROR(mesh.coord("x"), "has no axis named 'x'");
  EXPECT_QMESH_ERROR(mesh.group({"dp", "x"}), "has no axis named 'x'");
  EXPECT_QMESH_ERROR(mesh.group({}), "needs at least one axis");
  EXPECT_QMESH_ERROR(mesh.group({"dp", "dp"}), "axis 'dp' is listed twice");
  EXPECT_QMESH_ERROR(mesh.rank_of({0, 1}), "coordinate 1 of axis 'tp' is out of range [0, 1)");
  EXPECT_QMESH_ERROR(mesh.rank_of({0}), "rank_of got 1 coordinates");
}

// A local communicator that reports a made-up host layout.
class FakeHosts : public Communicator {
 public:
  FakeHosts(std::shared_ptr<Communicator> inner, std::vector<int> hosts)
      : inner_(std::move(inner)), hosts_(std::move(hosts)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view backend_name() const override { return inner_->backend_name(); }
  std::shared_ptr<Communicator> split(int color, int key) override {
    return inner_->split(color, key);
  }
  std::vector<int> host_ids() override { return hosts_; }
  WorkHandle all_reduce_async(TensorView b, ReduceOp op, Stream s) override {
    return inner_->all_reduce_async(b, op, s);
  }
  WorkHandle all_gather_async(TensorView i, TensorView o, Stream s) override {
    return inner_->all_gather_async(i, o, s);
  }
  WorkHandle reduce_scatter_async(TensorView i, TensorView o, ReduceOp op, Stream s) override {
    return inner_->reduce_scatter_async(i, o, op, s);
  }
  WorkHandle broadcast_async(TensorView b, int root, Stream s) override {
    return inner_->broadcast_async(b, root, s);
  }
  WorkHandle barrier_async() override { return inner_->barrier_async(); }
  WorkHandle send_async(TensorView i, int peer, int tag, Stream s) override {
    return inner_->send_async(i, peer, tag, s);
  }
  WorkHandle recv_async(TensorView o, int peer, int tag, Stream s) override {
    return inner_->recv_async(o, peer, tag, s);
  }
  int max_tag() const override { return inner_->max_tag(); }

 private:
  std::shared_ptr<Communicator> inner_;
  std::vector<int> hosts_;
};

TEST(Mesh, TopologyFindsAxesThatSpanHosts) {
  // Two hosts of two ranks each: {0,1} and {2,3}.
  run_local_ranks(4, [](Communicator& comm) {
    auto world =
        std::make_shared<FakeHosts>(comm.split(0, comm.rank()), std::vector<int>{0, 0, 1, 1});
    Mesh good(world, {{"dp", 2}, {"tp", 2}});
    EXPECT_FALSE(good.axis_spans_hosts("tp"));
    EXPECT_TRUE(good.axis_spans_hosts("dp"));
    Mesh bad(world, {{"tp", 2}, {"dp", 2}});  // warns: tp pairs ranks 0 and 2
    EXPECT_TRUE(bad.axis_spans_hosts("tp"));
    EXPECT_EQ(bad.host_ids(), (std::vector<int>{0, 0, 1, 1}));
  });
}

}  // namespace
}  // namespace qmesh
