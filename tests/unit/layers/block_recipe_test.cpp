// The block-scaling recipe (Recipe::kFp8Block) in the layers: Dense against a float64
// reference, no amax reduction anywhere (counted), sequence parallelism through the
// collective GEMMs (every schedule the same bits), and the configurations it refuses.
#include <gtest/gtest.h>

#include <vector>

#include "counting_communicator.h"
#include "dense_check.h"
#include "expect_error.h"
#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/fp8_stats.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using testing_mlp::borrowed;

// The values of an fp32 tensor on the host.
std::vector<float> floats(const TensorView& t) {
  return std::vector<float>(t.data_as<float>(), t.data_as<float>() + t.numel());
}

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
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kFp8Block);
    test::expect_dense_matches_reference(ctx, 20, 160, 136, {.gemm = 0.05});
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

// A column-parallel layer (GELU) and a row-parallel one with sequence parallelism, 6 tokens
// a rank (1x128 scale rows padded from 6 to 8 a chunk): forward, backward, every output and
// gradient of every rank. Counts the all-reduces of the forward passes into `forward_reduces`.
std::vector<std::vector<float>> run_sequence_parallel(int tp, Overlap overlap,
                                                      GatheredInput gathered,
                                                      int& forward_reduces) {
  constexpr int64_t kChunk = 6, kHidden = 128;
  const int64_t ffn = 128 * tp;
  std::vector<std::vector<std::vector<float>>> ranks(static_cast<size_t>(tp));
  forward_reduces = 0;
  run_local_ranks(tp, [&](Communicator& world) {
    auto counting = std::make_shared<testing::CountingCommunicator>(borrowed(world), true);
    LayerContext ctx(Mesh(counting, {{"tp", tp}}), Recipe::kFp8Block);
    DenseOptions column{.parallelism = DenseParallelism::kColumn,
                        .sequence_parallel = true,
                        .activation = DenseActivation::kGelu,
                        .overlap = overlap,
                        .gathered_input = gathered};
    DenseOptions row{
        .parallelism = DenseParallelism::kRow, .sequence_parallel = true, .overlap = overlap};
    Dense fc1("fc1", kHidden, ffn, column, ctx, 5), fc2("fc2", ffn, kHidden, row, ctx, 6);
    const int r = world.rank();
    const Tensor x = test::random_tensor(Shape{kChunk, kHidden}, uint64_t(10 + r));
    const Tensor dy = test::random_tensor(Shape{kChunk, kHidden}, uint64_t(20 + r));
    const int before = counting->all_reduces();
    const TensorView y = fc2.forward(fc1.forward(x));
    if (r == 0) forward_reduces = counting->all_reduces() - before;
    std::vector<std::vector<float>>& out = ranks[size_t(r)];
    out.push_back(floats(y));
    out.push_back(floats(fc1.backward(fc2.backward(dy))));
    for (Dense* d : {&fc1, &fc2})
      for (Parameter* p : d->parameters()) out.push_back(floats(p->grad));
  });
  std::vector<std::vector<float>> all;
  for (auto& rank : ranks)
    for (auto& t : rank) all.push_back(std::move(t));
  return all;
}

// Under the block recipe the sequence-parallel layers run the collective GEMMs on block-scaled
// operands: ring and bidir, and kRegather, give the bits of Overlap::kNone (and a forward pass
// still reduces no amax).
TEST(BlockRecipe, SequenceParallelSchedulesGiveTheSameBits) {
  for (int tp : {2, 4}) {
    int reduces = -1;
    const auto none = run_sequence_parallel(tp, Overlap::kNone, GatheredInput::kSave, reduces);
    EXPECT_EQ(reduces, 0) << "tp " << tp;
    struct Variant {
      Overlap overlap;
      GatheredInput gathered;
    };
    for (Variant v : {Variant{Overlap::kRing, GatheredInput::kSave},
                      Variant{Overlap::kBidirectional, GatheredInput::kSave},
                      Variant{Overlap::kRing, GatheredInput::kRegather}}) {
      const auto got = run_sequence_parallel(tp, v.overlap, v.gathered, reduces);
      EXPECT_EQ(reduces, 0);
      ASSERT_EQ(got.size(), none.size());
      for (size_t i = 0; i < got.size(); ++i)
        EXPECT_EQ(got[i], none[i]) << "tp " << tp << ", " << overlap_name(v.overlap)
                                   << (v.gathered == GatheredInput::kRegather ? " (regather)" : "")
                                   << ": tensor " << i << " (per rank: y, dx, dW1, db1, dW2, db2)";
    }
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
