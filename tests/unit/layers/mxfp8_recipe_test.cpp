// The MXFP8 recipe (Recipe::kMxfp8, MXFP8BlockScaling) in the layers: its defaults and
// validation, Dense against a float64 reference with emulated GEMMs (counted), the error
// without emulation, and the configurations it refuses.
#include <gtest/gtest.h>

#include <vector>

#include "counting_communicator.h"
#include "dense_check.h"
#include "expect_error.h"
#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/fp8_stats.h"
#include "qmesh/ops/gemm_emulation.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using testing_mlp::borrowed;

TEST(Mxfp8Recipe, HasTheNameMxfp8AndTransformerEnginesDefaults) {
  EXPECT_EQ(recipe_name(Recipe::kMxfp8), "mxfp8");
  EXPECT_EQ(parse_recipe("mxfp8"), Recipe::kMxfp8);
  const MXFP8BlockScaling r;
  EXPECT_EQ(r.fp8_format, Fp8Format::kE4M3);
  EXPECT_EQ(r.margin, 0.0f);
  EXPECT_FALSE(r.fp8_dpa);
  EXPECT_FALSE(r.fp8_mha);
  EXPECT_FALSE(r.emulate);
  validate(r);
  MXFP8BlockScaling bad;
  bad.margin = -1.0f;
  EXPECT_QMESH_ERROR(validate(bad), "MXFP8BlockScaling.margin must be finite and >= 0");
  bad = {};
  bad.fp8_dpa = true;
  EXPECT_QMESH_ERROR(validate(bad), "MXFP8BlockScaling.fp8_dpa must be false");
  bad = {};
  bad.fp8_mha = true;
  EXPECT_QMESH_ERROR(validate(bad), "MXFP8BlockScaling.fp8_mha must be false");
  bad = {};
  bad.fp8_format = static_cast<Fp8Format>(7);
  EXPECT_QMESH_ERROR(validate(bad), "MXFP8BlockScaling.fp8_format");
}

// y = x · Wᵀ + b, dx = dy · W, dW = dyᵀ · x, db = column sums of dy, in float64 from the fp32
// values, against the layer under MXFP8 (E4M3, emulated GEMMs). Tolerance (relative norm):
// 0.05 for the GEMMs (two E4M3 operands, unit roundoff 2^-4 each), fp32 rounding for db.
TEST(Mxfp8Recipe, DenseMatchesFloat64ReferenceWithEmulatedGemms) {
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContextOptions options;
    options.mxfp8.emulate = true;
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kMxfp8, options);
    const int64_t before = emulated_gemm_count();
    test::expect_dense_matches_reference(ctx, 64, 160, 96, {.gemm = 0.05});
    EXPECT_EQ(emulated_gemm_count() - before, 3);  // fprop, dgrad, wgrad
  });
}

// Each block's scale is its own: a tp = 2 column-parallel layer reduces no amax in forward
// and end_step issues no all-reduce (counted), and no scaling state is registered.
TEST(Mxfp8Recipe, IssuesNoAmaxReduction) {
  run_local_ranks(2, [&](Communicator& world) {
    auto counting = std::make_shared<testing::CountingCommunicator>(borrowed(world), true);
    LayerContextOptions options;
    options.mxfp8.emulate = true;
    LayerContext ctx(Mesh(counting, {{"tp", 2}}), Recipe::kMxfp8, options);
    DenseOptions column;
    column.parallelism = DenseParallelism::kColumn;
    Dense dense("d", 128, 256, column, ctx, 4);
    const Tensor x = test::random_tensor(Shape{32, 128}, 1);
    const Tensor dy = test::random_tensor(Shape{32, 128}, 2);
    const int before_forward = counting->all_reduces();
    dense.forward(x);
    EXPECT_EQ(counting->all_reduces() - before_forward, 0);
    dense.backward(dy);  // one all-reduce of the partial dx
    const int before_end = counting->all_reduces();
    ctx.end_step();
    EXPECT_EQ(counting->all_reduces() - before_end, 0);
    EXPECT_QMESH_ERROR(ctx.scaling(), "no FP8 operands were registered");
  });
}

TEST(Mxfp8Recipe, WithoutEmulationTheGemmIsAnErrorThatSaysHowToAsk) {
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kMxfp8);
    Dense dense("d", 64, 32, DenseOptions{}, ctx, 4);
    const Tensor x = test::random_tensor(Shape{32, 64}, 1);
    EXPECT_QMESH_ERROR(dense.forward(x), "MXFP8BlockScaling(emulate=True)");
  });
}

TEST(Mxfp8Recipe, RefusesWhatItDoesNotSupport) {
  run_local_ranks(1, [&](Communicator& comm) {
    const Mesh mesh(borrowed(comm), {{"tp", 1}});
    Fp8Stats stats;
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kMxfp8, {.fp8_stats = &stats}),
                       "per-tensor scaling only");
    MXFP8BlockScaling bad;
    bad.fp8_mha = true;
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kMxfp8, {.mxfp8 = bad}), "fp8_mha");
    LayerContextOptions options;
    options.mxfp8.emulate = true;
    LayerContext ctx(mesh, Recipe::kMxfp8, options);
    Dense dense("d", 64, 32, DenseOptions{}, ctx, 4);
    const Tensor x = test::random_tensor(Shape{20, 64}, 1);  // 20 tokens: not whole blocks
    EXPECT_QMESH_ERROR(dense.forward(x), "multiples of 32");
    DenseOptions sequence_parallel;
    sequence_parallel.parallelism = DenseParallelism::kColumn;
    sequence_parallel.sequence_parallel = true;
    EXPECT_QMESH_ERROR(Dense("sp", 64, 32, sequence_parallel, ctx, 4),
                       "MXFP8 runs without sequence parallelism");
  });
}

}  // namespace
}  // namespace qmesh
