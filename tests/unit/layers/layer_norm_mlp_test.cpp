// LayerNormMLP against a float64 reference (itself checked by finite differences), and the
// sharded block against the unsharded one for several dp x tp factorizations on the local
// (threads) backend.
#include <gtest/gtest.h>

#include "expect_error.h"
#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using namespace testing_mlp;

MlpRun run_unsharded(const ShardedCase& c) {
  ShardedCase u = c;
  u.tokens_per_dp = c.tokens_per_dp * c.dp;
  u.dp = u.tp = 1;
  u.sequence_parallel = false;
  MlpRun out;
  run_local_ranks(1, [&](Communicator& comm) { out = run_sharded(borrowed(comm), u); });
  return out;
}

MlpRun run_local(const ShardedCase& c) {
  std::vector<MlpRun> runs(size_t(c.dp * c.tp));
  run_local_ranks(c.dp * c.tp,
                  [&](Communicator& comm) { runs[comm.rank()] = run_sharded(borrowed(comm), c); });
  for (const auto& r : runs) EXPECT_EQ(r.y, runs[0].y) << "ranks disagree on the gathered output";
  return runs[0];
}

void expect_close(const MlpRun& got, const MlpRun& want, double tol, const char* what) {
  EXPECT_LT(rel_norm(got.y, want.y), tol) << what << ": y";
  EXPECT_LT(rel_norm(got.dx, want.dx), tol) << what << ": dx";
  EXPECT_LT(rel_norm(got.grads.gamma, want.grads.gamma), tol) << what << ": dgamma";
  EXPECT_LT(rel_norm(got.grads.beta, want.grads.beta), tol) << what << ": dbeta";
  EXPECT_LT(rel_norm(got.grads.w1, want.grads.w1), tol) << what << ": dW1";
  EXPECT_LT(rel_norm(got.grads.b1, want.grads.b1), tol) << what << ": db1";
  EXPECT_LT(rel_norm(got.grads.w2, want.grads.w2), tol) << what << ": dW2";
  EXPECT_LT(rel_norm(got.grads.b2, want.grads.b2), tol) << what << ": db2";
}

// The float64 reference of the one-step case.
TEST(LayerNormMLPReference, AgreesWithFiniteDifferences) {
  ShardedCase c;
  c.hidden = 6, c.ffn = 10, c.tokens_per_dp = 3;
  MlpParams p = initial_params(c);
  const int64_t T = 3, H = 6, F = 10;
  const auto x = sample(1, 0, T * H), dy = sample(2, 0, T * H);
  const MlpRun r = reference(p, x, dy, T, H, F);
  // L = sum(y * dy), so dL/dθ is what the reference returns for θ.
  auto loss = [&](const MlpParams& q, const std::vector<double>& xx) {
    const auto y = reference(q, xx, {}, T, H, F).y;
    double s = 0;
    for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
    return s;
  };
  const double eps = 1e-6;
  auto check = [&](std::vector<double>& theta, const std::vector<double>& grad, const char* name,
                   bool is_x) {
    for (size_t i = 0; i < theta.size(); i += 3) {
      const double keep = theta[i];
      theta[i] = keep + eps;
      const double up = is_x ? loss(p, theta) : loss(p, x);
      theta[i] = keep - eps;
      const double down = is_x ? loss(p, theta) : loss(p, x);
      theta[i] = keep;
      EXPECT_NEAR((up - down) / (2 * eps), grad[i], 1e-6 * (1 + std::abs(grad[i])))
          << name << "[" << i << "]";
    }
  };
  std::vector<double> xx = x;
  check(xx, r.dx, "x", true);
  check(p.gamma, r.grads.gamma, "gamma", false);
  check(p.beta, r.grads.beta, "beta", false);
  check(p.w1, r.grads.w1, "w1", false);
  check(p.b1, r.grads.b1, "b1", false);
  check(p.w2, r.grads.w2, "w2", false);
  check(p.b2, r.grads.b2, "b2", false);
}

TEST(LayerNormMLP, Fp32MatchesFloat64Reference) {
  ShardedCase c;
  c.steps = 1;
  expect_close(run_unsharded(c), reference_of(c), 2e-5, "fp32");
}

// The BF16 and FP8 recipes keep the [T, ffn] activations in bf16 by default
// (LayerContextOptions::activation_dtype); each test runs both choices, and the two must differ
// (bf16 activations round the pre-activation and the hidden gradient once more).
constexpr DType kActivationDtypes[] = {DType::kBFloat16, DType::kFloat32};

TEST(LayerNormMLP, Bf16IsCloseToFloat64Reference) {
  std::vector<MlpRun> runs;
  for (DType activations : kActivationDtypes) {
    ShardedCase c;
    c.steps = 1;
    c.recipe = Recipe::kBf16;
    c.activation_dtype = activations;
    runs.push_back(run_unsharded(c));
    expect_close(runs.back(), reference_of(c), 2e-2, dtype_name(activations).data());
  }
  // Forward feeds fc2 bf16(gelu(pre)) either way; backward reads the bf16 pre-activation.
  EXPECT_NE(runs[0].grads.w1, runs[1].grads.w1);
  ShardedCase c;
  c.steps = 1;
  c.recipe = Recipe::kBf16;
  expect_bitwise_equal(run_unsharded(c), runs[0], "bf16 activations by default");
}

// FP8 (E4M3 forward, E5M2 gradients): tolerances follow the formats' precision
// (docs/numerics.md "Tolerances": TE's JAX tests use ~eps^(2/3), 0.25 for e4m3, 0.4 for e5m2, per
// element); relative norms over many elements are well below that.
// The block recipe (E4M3 everywhere, a scale per 1x128 block or 128x128 tile; GELU and its
// backward as separate passes before the block casts) meets the same bounds.
TEST(LayerNormMLP, Fp8IsCloseToFloat64Reference) {
  for (Recipe recipe : {Recipe::kFp8Current, Recipe::kFp8Delayed, Recipe::kFp8Block}) {
    std::vector<MlpRun> runs;
    for (DType activations : kActivationDtypes) {
      ShardedCase c;
      c.steps = 1;
      c.recipe = recipe;
      c.activation_dtype = activations;
      const MlpRun got = run_unsharded(c), want = reference_of(c);
      const std::string what = detail::concat(recipe_name(recipe), ", ", dtype_name(activations));
      EXPECT_LT(rel_norm(got.y, want.y), 0.05) << what;
      EXPECT_LT(rel_norm(got.dx, want.dx), 0.1) << what;
      EXPECT_LT(rel_norm(got.grads.w1, want.grads.w1), 0.15) << what;
      EXPECT_LT(rel_norm(got.grads.w2, want.grads.w2), 0.15) << what;
      runs.push_back(got);
    }
    EXPECT_NE(runs[0].grads.w1, runs[1].grads.w1) << recipe_name(recipe);
  }
}

struct Factorization {
  int dp, tp;
  bool sp;
  Recipe recipe;
};

void PrintTo(const Factorization& f, std::ostream* os) {
  *os << "dp" << f.dp << "_tp" << f.tp << (f.sp ? "_sp_" : "_") << recipe_name(f.recipe);
}

class ShardedLayerNormMLP : public testing::TestWithParam<Factorization> {};

// Sharding must not change the math: the same global batch gives the same outputs and
// gradients, to rounding, for every factorization (two steps, so that delayed scaling's
// update with the globally reduced amax is exercised).
TEST_P(ShardedLayerNormMLP, EqualsUnsharded) {
  const Factorization f = GetParam();
  ShardedCase c;
  c.dp = f.dp, c.tp = f.tp, c.sequence_parallel = f.sp, c.recipe = f.recipe;
  // The block recipe shards whole 128-wide blocks: ffn / tp a multiple of 128.
  if (f.recipe == Recipe::kFp8Block) c.ffn = 128 * f.tp;
  // Row-parallel partial sums round differently; in bf16/FP8 an operand that differs in
  // its last fp32 bit can then round to a neighbouring code.
  const double tol = f.recipe == Recipe::kFp32 ? 1e-5 : 2e-3;
  expect_close(run_local(c), run_unsharded(c), tol, "sharded vs unsharded");
}

INSTANTIATE_TEST_SUITE_P(
    Factorizations, ShardedLayerNormMLP,
    testing::Values(
        Factorization{1, 2, false, Recipe::kFp32}, Factorization{2, 2, false, Recipe::kFp32},
        Factorization{2, 2, true, Recipe::kFp32}, Factorization{1, 3, false, Recipe::kFp32},
        Factorization{1, 3, true, Recipe::kFp32}, Factorization{3, 2, true, Recipe::kFp32},
        Factorization{1, 4, true, Recipe::kFp32}, Factorization{2, 2, true, Recipe::kBf16},
        Factorization{3, 2, false, Recipe::kBf16}, Factorization{2, 2, false, Recipe::kFp8Delayed},
        Factorization{2, 2, true, Recipe::kFp8Delayed},
        Factorization{1, 3, true, Recipe::kFp8Delayed},
        Factorization{3, 2, true, Recipe::kFp8Current},
        Factorization{2, 2, false, Recipe::kFp8Block},
        Factorization{1, 3, false, Recipe::kFp8Block}, Factorization{2, 2, true, Recipe::kFp8Block},
        Factorization{1, 3, true, Recipe::kFp8Block}),
    [](const auto& p) {
      std::ostringstream os;
      PrintTo(p.param, &os);
      return os.str();
    });

class OverlappedLayerNormMLP : public testing::TestWithParam<Factorization> {};

// The collective-GEMM schedules change when data moves, not the math: with sequence
// parallelism, ring and bidirectional overlap give the same bits as no overlap (outputs and
// every gradient), and so the same agreement with the unsharded block. So does gathering
// fc1's input again in backward (bulk overlap with dgrad) instead of keeping it.
TEST_P(OverlappedLayerNormMLP, IsBitwiseEqualToUnoverlapped) {
  const Factorization f = GetParam();
  ShardedCase c;
  c.dp = f.dp, c.tp = f.tp, c.sequence_parallel = true, c.recipe = f.recipe;
  const MlpRun none = run_local(c);
  for (GatheredInput g : {GatheredInput::kSave, GatheredInput::kRegather}) {
    c.gathered_input = g;
    const char* kept = g == GatheredInput::kSave ? "save" : "regather";
    for (Overlap o : {Overlap::kNone, Overlap::kRing, Overlap::kBidirectional}) {
      if (g == GatheredInput::kSave && o == Overlap::kNone) continue;  // the baseline
      c.overlap = o;
      expect_bitwise_equal(run_local(c), none, detail::concat(overlap_name(o), ", ", kept));
    }
  }
  expect_close(none, run_unsharded(c), f.recipe == Recipe::kFp32 ? 1e-5 : 2e-3,
               "overlapped sharded vs unsharded");
}

INSTANTIATE_TEST_SUITE_P(Factorizations, OverlappedLayerNormMLP,
                         testing::Values(Factorization{1, 2, true, Recipe::kFp32},
                                         Factorization{1, 3, true, Recipe::kBf16},
                                         Factorization{2, 2, true, Recipe::kFp8Delayed},
                                         Factorization{1, 4, true, Recipe::kFp8Current},
                                         Factorization{1, 4, true, Recipe::kFp32}),
                         [](const auto& p) {
                           std::ostringstream os;
                           PrintTo(p.param, &os);
                           return os.str();
                         });

TEST(LayerNormMLP, BadShapesAreClearErrors) {
  run_local_ranks(2, [&](Communicator& comm) {
    Mesh mesh(borrowed(comm), {{"dp", 1}, {"tp", 2}});
    LayerContext ctx(mesh, Recipe::kFp32);
    EXPECT_QMESH_ERROR(LayerNormMLP("m", 8, 7, {}, ctx, 1),
                       "out_features 7 is not divisible by the tensor-parallel size 2");
    LayerNormMLP block("m", 8, 16, {}, ctx, 1);
    Tensor wrong(DType::kFloat32, Shape{4, 6});
    EXPECT_QMESH_ERROR(block.forward(wrong), "last dimension must be 8, got shape [4, 6]");
    Tensor dy(DType::kFloat32, Shape{4, 8});
    EXPECT_QMESH_ERROR(block.backward(dy), "backward called before forward");
  });
}

TEST(Dense, OptionConflictsAreClearErrors) {
  run_local_ranks(1, [&](Communicator& comm) {
    Mesh mesh(borrowed(comm), {{"tp", 1}});
    LayerContext ctx(mesh, Recipe::kBf16);
    EXPECT_QMESH_ERROR(
        Dense("d", 4, 4,
              {DenseParallelism::kRow, false, true, DenseActivation::kGelu, std::nullopt}, ctx, 1),
        "cannot fuse GELU");
    EXPECT_QMESH_ERROR(
        Dense("d", 4, 4,
              {DenseParallelism::kNone, true, true, DenseActivation::kNone, std::nullopt}, ctx, 1),
        "sequence_parallel needs column or row parallelism");
    DenseOptions producer{DenseParallelism::kNone, false, true, DenseActivation::kNone,
                          std::nullopt};
    producer.gelu_split = DenseGeluSplit::kProducer;
    EXPECT_QMESH_ERROR(Dense("d", 4, 4, producer, ctx, 1), "kProducer needs activation kGelu");
    DenseOptions consumer{DenseParallelism::kNone, false, true, DenseActivation::kGelu,
                          std::nullopt};
    consumer.gelu_split = DenseGeluSplit::kConsumer;
    EXPECT_QMESH_ERROR(Dense("d", 4, 4, consumer, ctx, 1), "set activation kNone");
    EXPECT_QMESH_ERROR(parse_recipe("fp4"), "unknown recipe 'fp4'");
  });
}

// A GELU split between two layers (DenseGeluSplit: GELU and its backward inside the FP8 casts)
// computes what GELU in the first layer's forward computes: outputs, dx and every gradient.
TEST(Dense, GeluSplitEqualsGeluInTheFirstLayer) {
  for (Recipe recipe : {Recipe::kFp32, Recipe::kFp8Delayed, Recipe::kFp8Current}) {
    run_local_ranks(1, [&](Communicator& comm) {
      Mesh mesh(borrowed(comm), {{"tp", 1}});
      struct Pair {
        std::vector<double> y, dx, grads;
      };
      auto run = [&](bool split) {
        LayerContext ctx(mesh, recipe);
        DenseOptions o1{DenseParallelism::kNone, false, true, DenseActivation::kGelu, std::nullopt};
        DenseOptions o2{DenseParallelism::kNone, false, true, DenseActivation::kNone, std::nullopt};
        if (split) {
          o1.gelu_split = DenseGeluSplit::kProducer;
          o2.gelu_split = DenseGeluSplit::kConsumer;
        }
        Dense fc1("fc1", 24, 48, o1, ctx, 3), fc2("fc2", 48, 24, o2, ctx, 4);
        const Tensor x = test::random_tensor(Shape{40, 24}, 5);
        const Tensor dy = test::random_tensor(Shape{40, 24}, 6);
        auto doubles = [](const TensorView& t) {
          const float* p = static_cast<const float*>(t.data);
          return std::vector<double>(p, p + t.numel());
        };
        Pair out;
        out.y = doubles(fc2.forward(fc1.forward(x)));
        out.dx = doubles(fc1.backward(fc2.backward(dy)));
        for (Parameter* p :
             {&fc1.weight(), fc1.parameters()[1], &fc2.weight(), fc2.parameters()[1]}) {
          const std::vector<double> g = doubles(p->grad);
          out.grads.insert(out.grads.end(), g.begin(), g.end());
        }
        return out;
      };
      const Pair split = run(true), plain = run(false);
      // fp32: the GELU of the GEMM epilogue against the layer op (rounding); FP8: a value that
      // rounds differently in fp32 can land on the next code.
      const double tol = recipe == Recipe::kFp32 ? 1e-6 : 1e-2;
      EXPECT_LT(rel_norm(split.y, plain.y), tol) << recipe_name(recipe);
      EXPECT_LT(rel_norm(split.dx, plain.dx), tol) << recipe_name(recipe);
      EXPECT_LT(rel_norm(split.grads, plain.grads), tol) << recipe_name(recipe);
    });
  }
}

// Under per-tensor FP8 LayerNormMLP and LayerNormDense run their LayerNorm inside the first
// layer's input cast (norm_forward): the same bits as the LayerNorm, then that layer, built
// from the same parts (y, dx and every gradient, over two steps of delayed scaling).
TEST(LayerNormMLP, NormFusedIntoTheCastEqualsTheUnfusedLayers) {
  for (Recipe recipe : {Recipe::kFp8Delayed, Recipe::kFp8Current}) {
    for (DType activations : kActivationDtypes) {
      run_local_ranks(1, [&](Communicator& comm) {
        Mesh mesh(borrowed(comm), {{"dp", 1}, {"tp", 1}});
        const int64_t T = 24, H = 32, F = 64;
        auto doubles = [](const TensorView& t) {
          const float* p = static_cast<const float*>(t.data);
          return std::vector<double>(p, p + t.numel());
        };
        // y, dx and the parameters' gradients of two steps, concatenated.
        auto steps = [&](LayerContext& ctx, auto&& forward, auto&& backward,
                         const std::vector<Parameter*>& params) {
          std::vector<double> out;
          for (int step = 0; step < 2; ++step) {
            const Tensor x = test::random_tensor(Shape{T, H}, 10 + step, -2.0f, 3.0f);
            const Tensor dy = test::random_tensor(Shape{T, H}, 20 + step);
            for (const TensorView& t : {forward(x), backward(dy)}) {
              const std::vector<double> v = doubles(t);
              out.insert(out.end(), v.begin(), v.end());
            }
            for (Parameter* p : params) {
              const std::vector<double> g = doubles(p->grad);
              out.insert(out.end(), g.begin(), g.end());
            }
            ctx.end_step();
          }
          return out;
        };
        const LayerContextOptions options{.activation_dtype = activations};
        LayerContext fused_ctx(mesh, recipe, options), ctx(mesh, recipe, options);
        LayerNormMLP block("m", H, F, {}, fused_ctx, 7);
        LayerNorm ln("m.ln", H, 1e-5f, ctx, false);
        Dense fc1("m.fc1", H, F,
                  DenseOptions{DenseParallelism::kColumn, false, true, DenseActivation::kGelu,
                               std::nullopt, GatheredInput::kSave, DenseGeluSplit::kProducer,
                               activations},
                  ctx, 15);
        Dense fc2("m.fc2", F, H,
                  DenseOptions{DenseParallelism::kRow, false, true, DenseActivation::kNone,
                               std::nullopt, GatheredInput::kSave, DenseGeluSplit::kConsumer},
                  ctx, 16);
        std::vector<Parameter*> params = ln.parameters();
        for (Dense* d : {&fc1, &fc2})
          for (Parameter* p : d->parameters()) params.push_back(p);
        const std::vector<double> fused = steps(
            fused_ctx, [&](const Tensor& x) { return block.forward(x); },
            [&](const Tensor& dy) { return block.backward(dy); }, block.parameters());
        const std::vector<double> unfused = steps(
            ctx, [&](const Tensor& x) { return fc2.forward(fc1.forward(ln.forward(x)), x); },
            [&](const Tensor& dy) { return ln.backward(fc1.backward(fc2.backward(dy)), dy); },
            params);
        EXPECT_EQ(fused, unfused) << recipe_name(recipe) << ", " << dtype_name(activations);

        LayerContext dense_fused_ctx(mesh, recipe, options), dense_ctx(mesh, recipe, options);
        LayerNormDense ln_dense("d", H, F, false, dense_fused_ctx, 9);
        LayerNorm ln2("d.ln", H, 1e-5f, dense_ctx, false);
        Dense dense("d.dense", H, F,
                    DenseOptions{DenseParallelism::kColumn, false, true, DenseActivation::kNone,
                                 std::nullopt},
                    dense_ctx, 9);
        std::vector<Parameter*> params2 = ln2.parameters();
        for (Parameter* p : dense.parameters()) params2.push_back(p);
        const Tensor dy_dense = test::random_tensor(Shape{T, F}, 30);
        const std::vector<double> fused2 = steps(
            dense_fused_ctx, [&](const Tensor& x) { return ln_dense.forward(x); },
            [&](const Tensor&) { return ln_dense.backward(dy_dense); }, ln_dense.parameters());
        const std::vector<double> unfused2 = steps(
            dense_ctx, [&](const Tensor& x) { return dense.forward(ln2.forward(x)); },
            [&](const Tensor&) { return ln2.backward(dense.backward(dy_dense)); }, params2);
        EXPECT_EQ(fused2, unfused2) << recipe_name(recipe) << ", LayerNormDense";
      });
    }
  }
}

}  // namespace
}  // namespace qmesh
