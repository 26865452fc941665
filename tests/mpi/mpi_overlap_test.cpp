// Collective GEMMs over 4 processes (tp = 4) on the MPI backend, or on UCX with
// QMESH_TEST_WORLD=ucx: every Overlap schedule gives the same bits as the unoverlapped one and
// agrees with a float64 reference, for fp32, bf16 and FP8 operands; and a sequence-parallel
// LayerNormMLP gives the same bits with and without overlap (and with fc1's input
// gathered again in backward), forward and backward.
#include <gtest/gtest.h>

#include "collective_gemm_checks.h"
#include "mlp_harness.h"
#include "qmesh/param.h"
#include "test_world.h"

namespace qmesh {
namespace {

using namespace testing_overlap;
using testing_world::world;

TEST(OverlapWorld, IsTheRequestedBackend) {
  EXPECT_EQ(world()->backend_name(), param_string("TEST_WORLD", "mpi"));
}

class MpiCollectiveGemm : public testing::TestWithParam<Operands> {};

TEST_P(MpiCollectiveGemm, AllGatherGemmIsBitwiseEqualToUnoverlapped) {
  ASSERT_EQ(world()->size(), 4) << "run with mpirun -np 4";
  check_all_gather_gemm(*world(), GetParam());
}

TEST_P(MpiCollectiveGemm, GemmReduceScatterIsBitwiseEqualToUnoverlapped) {
  ASSERT_EQ(world()->size(), 4) << "run with mpirun -np 4";
  check_gemm_reduce_scatter(*world(), GetParam());
}

INSTANTIATE_TEST_SUITE_P(Operands, MpiCollectiveGemm,
                         testing::Values(Operands::kFp32, Operands::kBf16, Operands::kFp8),
                         [](const auto& p) { return std::string(operands_name(p.param)); });

class MpiOverlappedMLP : public testing::TestWithParam<Recipe> {};

TEST_P(MpiOverlappedMLP, IsBitwiseEqualToUnoverlapped) {
  using namespace testing_mlp;
  ASSERT_EQ(world()->size(), 4) << "run with mpirun -np 4";
  ShardedCase c;
  c.tp = 4, c.sequence_parallel = true, c.recipe = GetParam();
  const MlpRun none = run_sharded(world(), c);
  for (Overlap o : {Overlap::kRing, Overlap::kBidirectional}) {
    c.overlap = o;
    expect_bitwise_equal(run_sharded(world(), c), none, std::string(overlap_name(o)));
  }
  c.gathered_input = GatheredInput::kRegather;  // fc1's input gathered again during dgrad
  expect_bitwise_equal(run_sharded(world(), c), none, "ring, regather");
}

INSTANTIATE_TEST_SUITE_P(Recipes, MpiOverlappedMLP,
                         testing::Values(Recipe::kFp32, Recipe::kBf16, Recipe::kFp8Delayed,
                                         Recipe::kFp8Current),
                         [](const auto& p) { return std::string(recipe_name(p.param)); });

}  // namespace
}  // namespace qmesh
