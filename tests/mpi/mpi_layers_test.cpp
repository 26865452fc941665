// Sharded LayerNormMLP == unsharded under mpirun, over the MPI backend: every rank runs its
// shard of the block and also the unsharded block on its own (a one-rank local world), and
// compares the gathered outputs and gradients. Run with 4 ranks.
#include <gtest/gtest.h>

#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/mpi.h"

namespace qmesh {
namespace {

using namespace testing_mlp;

struct Case {
  int dp, tp;
  bool sp;
  Recipe recipe;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "dp" << c.dp << "_tp" << c.tp << (c.sp ? "_sp_" : "_") << recipe_name(c.recipe);
}

class MpiShardedMLP : public testing::TestWithParam<Case> {};

TEST_P(MpiShardedMLP, EqualsUnsharded) {
  const Case p = GetParam();
  const auto world = make_mpi_world();
  ASSERT_EQ(world->size(), p.dp * p.tp) << "run with mpirun -np " << p.dp * p.tp;
  ShardedCase c;
  c.dp = p.dp, c.tp = p.tp, c.sequence_parallel = p.sp, c.recipe = p.recipe;
  // The block recipe shards whole 128-wide blocks: ffn / tp a multiple of 128.
  if (p.recipe == Recipe::kFp8Block) c.ffn = 128 * p.tp;
  const MlpRun sharded = run_sharded(world, c);
  ShardedCase u = c;
  u.dp = u.tp = 1, u.sequence_parallel = false, u.tokens_per_dp = c.tokens_per_dp * c.dp;
  MlpRun unsharded;
  run_local_ranks(1, [&](Communicator& comm) {
    unsharded = run_sharded(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), u);
  });
  const double tol = p.recipe == Recipe::kFp32 ? 1e-5 : 2e-3;
  EXPECT_LT(rel_norm(sharded.y, unsharded.y), tol);
  EXPECT_LT(rel_norm(sharded.dx, unsharded.dx), tol);
  EXPECT_LT(rel_norm(sharded.grads.gamma, unsharded.grads.gamma), tol);
  EXPECT_LT(rel_norm(sharded.grads.w1, unsharded.grads.w1), tol);
  EXPECT_LT(rel_norm(sharded.grads.b1, unsharded.grads.b1), tol);
  EXPECT_LT(rel_norm(sharded.grads.w2, unsharded.grads.w2), tol);
  EXPECT_LT(rel_norm(sharded.grads.b2, unsharded.grads.b2), tol);
}

INSTANTIATE_TEST_SUITE_P(
    FourRanks, MpiShardedMLP,
    testing::Values(Case{2, 2, false, Recipe::kFp32}, Case{2, 2, true, Recipe::kFp32},
                    Case{1, 4, true, Recipe::kFp32}, Case{4, 1, false, Recipe::kBf16},
                    Case{2, 2, true, Recipe::kFp8Delayed}, Case{1, 4, false, Recipe::kFp8Current},
                    Case{2, 2, false, Recipe::kFp8Block}, Case{1, 4, true, Recipe::kFp8Block}),
    [](const auto& p) {
      std::ostringstream os;
      PrintTo(p.param, &os);
      return os.str();
    });

}  // namespace
}  // namespace qmesh
