// The block-scaling recipe (Recipe::kFp8Block) in the layers: Dense against a float64
// reference, no amax reduction anywhere (counted), and the configurations it refuses.
#include <gtest/gtest.h>

#include <vector>

#include "counting_communicator.h"
#include "dense_reference.h"
#include "expect_error.h"
#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/fp8_stats.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using testing_mlp::borrowed;
using testing_mlp::doubles;
using testing_mlp::rel_norm;

TEST(BlockRecipe, HasTheNameBlock) {
  EXPECT_EQ(recipe_name(Recipe::kFp8Block), "block");
  EXPECT_EQ(parse_recipe("block"), Recipe::kFp8Block);
}

// y = x · Wᵀ + b, dx = dy · W, dW = dyᵀ · x, db = column sums of dy, in float64 from the fp32
// values, against the layer under the block recipe (E4M3 everywhere, power-of-two block
// scales). Sizes with whole and partial blocks. Tolerance (relative norm): 0.05 for the GEMMs
// (two E4M3 operands, unit roundoff 2^-4 each; measured 0.026 for y, 0.035 for dx, 0.033
// for dW), fp32 rounding for db.
TEST(BlockRecipe, DenseMatchesFloat64Reference) {
  const int64_t T = 20, in = 160, out = 136;
  const Tensor x = test::random_tensor(Shape{T, in}, 1);
  const Tensor dy = test::random_tensor(Shape{T, out}, 2);
  const Tensor bias = test::random_tensor(Shape{out}, 3);
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kFp8Block);
    Dense dense("d", in, out, DenseOptions{}, ctx, 4);
    Parameter& b = *dense.parameters()[1];
    std::copy_n(bias.data_as<float>(), out, b.value.data_as<float>());
    const std::vector<double> y = doubles(dense.forward(x));
    const std::vector<double> dx = doubles(dense.backward(dy));
    const test::DenseReference want =
        test::dense_reference(x.data_as<float>(), dense.weight().value.data_as<float>(),
                              bias.data_as<float>(), dy.data_as<float>(), T, in, out);
    EXPECT_LT(rel_norm(y, want.y), 0.05);
    EXPECT_LT(rel_norm(dx, want.dx), 0.05);
    EXPECT_LT(rel_norm(doubles(dense.weight().grad), want.dw), 0.05);
    EXPECT_LT(rel_norm(doubles(b.grad), want.db), 1e-5);
    // The operands are FP8: not the fp32 result.
    EXPECT_GT(rel_norm(y, want.y), 1e-4);
  });
}

// Block scales come from each block alone: no forward cast reduces an amax over tp (current
// scaling does) and end_step issues no all-reduce (delayed scaling issues one); no scaling
// state is registered. Counted on a tp = 2 column-parallel layer.
TEST(BlockRecipe, IssuesNoAmaxReduction) {
  for (Recipe recipe : {Recipe::kFp8Block, Recipe::kFp8Current, Recipe::kFp8Delayed}) {
    run_local_ranks(2, [&](Communicator& world) {
      auto counting = std::make_shared<testing::CountingCommunicator>(borrowed(world), true);
      LayerContext ctx(Mesh(counting, {{"tp", 2}}), recipe);
      DenseOptions column;
      column.parallelism = DenseParallelism::kColumn;
      Dense dense("d", 128, 256, column, ctx, 4);
      const Tensor x = test::random_tensor(Shape{8, 128}, 1);
      const Tensor dy = test::random_tensor(Shape{8, 128}, 2);
      const int before_forward = counting->all_reduces();
      dense.forward(x);
      const int in_forward = counting->all_reduces() - before_forward;
      dense.backward(dy);  // one all-reduce of the partial dx
      const int before_end = counting->all_reduces();
      ctx.end_step();
      const int in_end_step = counting->all_reduces() - before_end;
      if (recipe == Recipe::kFp8Block) {
        EXPECT_EQ(in_forward, 0);
        EXPECT_EQ(in_end_step, 0);
        EXPECT_QMESH_ERROR(ctx.scaling(), "no FP8 operands were registered");
      } else if (recipe == Recipe::kFp8Current) {
        EXPECT_EQ(in_forward, 2);  // x's and W's amax
        EXPECT_EQ(in_end_step, 0);
      } else {
        EXPECT_EQ(in_end_step, 1);
      }
    });
  }
}

TEST(BlockRecipe, RefusesWhatItDoesNotSupport) {
  run_local_ranks(2, [&](Communicator& world) {
    const Mesh mesh(borrowed(world), {{"tp", 2}});
    LayerContext ctx(mesh, Recipe::kFp8Block);
    DenseOptions column;
    column.parallelism = DenseParallelism::kColumn;
    // 192 / 2 = 96 output features per rank: cuts the 128x128 weight tiles.
    EXPECT_QMESH_ERROR(Dense("d", 128, 192, column, ctx, 1),
                       "shards out_features 192 over tp=2 into 96 features per rank");
    DenseOptions row;
    row.parallelism = DenseParallelism::kRow;
    EXPECT_QMESH_ERROR(Dense("d", 320, 128, row, ctx, 1),
                       "shards in_features 320 over tp=2 into 160 features per rank");
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kFp8Block, {.overlap = Overlap::kRing}),
                       "set Overlap::kNone");
    Fp8Stats stats;
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kFp8Block, {.fp8_stats = &stats}),
                       "per-tensor scaling only");
    Float8BlockScaling bad;
    bad.fp8_dpa = true;
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kFp8Block, {.block = bad}), "fp8_dpa");
  });
}

}  // namespace
}  // namespace qmesh
