// The NVFP4 recipe (Recipe::kNvfp4, NVFP4BlockScaling) in the layers: its defaults and
// validation, Dense against a float64 reference with emulated GEMMs (counted), stochastic
// rounding drawn from the layer and step, tp = 2 against tp = 1 (the weight's amax reduced,
// counted), a checkpoint resumed bit for bit, the error without emulation, and the
// configurations it refuses.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "counting_communicator.h"
#include "dense_check.h"
#include "expect_error.h"
#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/fp8_stats.h"
#include "qmesh/ops/gemm_emulation.h"
#include "qmesh/train/checkpoint.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using testing_mlp::borrowed;
using testing_mlp::doubles;
using testing_mlp::rel_norm;

LayerContextOptions emulated() {
  LayerContextOptions options;
  options.nvfp4.emulate = true;
  return options;
}

TEST(Nvfp4Recipe, HasTheNameNvfp4AndTransformerEnginesDefaults) {
  EXPECT_EQ(recipe_name(Recipe::kNvfp4), "nvfp4");
  EXPECT_EQ(parse_recipe("nvfp4"), Recipe::kNvfp4);
  const NVFP4BlockScaling r;
  EXPECT_EQ(r.fp4_format, Fp4Format::kE2M1);
  EXPECT_EQ(r.fp8_format, Fp8Format::kE4M3);
  EXPECT_FALSE(r.disable_rht);
  EXPECT_FALSE(r.disable_stochastic_rounding);
  EXPECT_FALSE(r.disable_2d_quantization);
  EXPECT_FALSE(r.emulate);
  validate(r);
  NVFP4BlockScaling bad;
  bad.fp4_format = static_cast<Fp4Format>(3);
  EXPECT_QMESH_ERROR(validate(bad), "NVFP4BlockScaling.fp4_format must be Fp4Format::kE2M1");
  bad = {};
  bad.fp8_format = Fp8Format::kHybrid;
  EXPECT_QMESH_ERROR(validate(bad), "NVFP4BlockScaling.fp8_format must be Fp8Format::kE4M3");
  bad = {};
  bad.fp8_dpa = true;
  EXPECT_QMESH_ERROR(validate(bad), "NVFP4BlockScaling.fp8_dpa must be false");
  bad = {};
  bad.fp8_mha = true;
  EXPECT_QMESH_ERROR(validate(bad), "NVFP4BlockScaling.fp8_mha must be false");
}

// Tolerance (relative norm) 0.25 for the GEMMs: two E2M1 operands (one mantissa bit: an
// element rounds by up to a quarter of its binade), the weight in 16x16 tiles, dy rounded
// stochastically (a larger error than nearest rounding, unbiased). Measured on these sizes:
// 0.111 for y, 0.183 for dx, 0.167 for dW (the RHT cancels in dW: it would be ~1.4 if not).
TEST(Nvfp4Recipe, DenseMatchesFloat64ReferenceWithEmulatedGemms) {
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kNvfp4, emulated());
    const int64_t before = emulated_gemm_count();
    test::expect_dense_matches_reference(ctx, 64, 160, 96, {.gemm = 0.25});
    EXPECT_EQ(emulated_gemm_count() - before, 3);  // fprop, dgrad, wgrad
  });
}

// dx and dW of one step of Dense(64 -> 32) at context step `step`.
std::vector<std::vector<float>> gradients(int64_t step, const NVFP4BlockScaling& recipe) {
  std::vector<std::vector<float>> out;
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContextOptions options;
    options.nvfp4 = recipe;
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kNvfp4, options);
    ctx.set_steps(step);
    Dense dense("d", 64, 32, DenseOptions{}, ctx, 4);
    const Tensor x = test::random_tensor(Shape{32, 64}, 1);
    const Tensor dy = test::random_tensor(Shape{32, 32}, 2);
    dense.forward(x);
    const TensorView dx = dense.backward(dy);
    out.emplace_back(dx.data_as<float>(), dx.data_as<float>() + dx.numel());
    const TensorView dw = dense.weight().grad;
    out.emplace_back(dw.data_as<float>(), dw.data_as<float>() + dw.numel());
  });
  return out;
}

// Stochastic rounding and the RHT signs come from (layer seed, step): the same step gives
// the same bits, another step other bits; with both switched off the step changes nothing.
TEST(Nvfp4Recipe, StochasticRoundingIsReproducibleFromLayerAndStep) {
  NVFP4BlockScaling r;
  r.emulate = true;
  EXPECT_EQ(gradients(3, r), gradients(3, r));
  const auto other = gradients(4, r), three = gradients(3, r);
  EXPECT_NE(other[0], three[0]);  // dx: dy's rowwise copy rounded with other bits
  EXPECT_NE(other[1], three[1]);  // dW: other bits and other RHT signs
  r.disable_stochastic_rounding = true;
  r.disable_rht = true;
  EXPECT_EQ(gradients(3, r), gradients(4, r));
}

// Column parallel over tp = 2 against tp = 1: the weight's amax is reduced over tp (one
// all-reduce in forward, counted), so each shard is quantized as its slice of the whole
// weight and y is tp = 1's up to the fp32 GEMM's rounding; dx and dW quantize dy's shards with
// their own tensor scales and rounding bits: within the recipe's noise of tp = 1.
TEST(Nvfp4Recipe, TensorParallelMatchesOneRank) {
  const int64_t T = 32, in = 64, out = 64;
  const Tensor x = test::random_tensor(Shape{T, in}, 1);
  const Tensor dy = test::random_tensor(Shape{T, out}, 2);
  std::vector<std::vector<double>> y(2), dx(2), dw(2);  // [tp - 1], global layouts
  for (int tp : {1, 2}) {
    std::vector<std::vector<double>> ys(static_cast<size_t>(tp)), dws(static_cast<size_t>(tp));
    run_local_ranks(tp, [&](Communicator& world) {
      auto counting = std::make_shared<testing::CountingCommunicator>(borrowed(world), true);
      LayerContext ctx(Mesh(counting, {{"tp", tp}}), Recipe::kNvfp4, emulated());
      DenseOptions column;
      column.parallelism = DenseParallelism::kColumn;
      column.bias = false;
      Dense dense("d", in, out, column, ctx, 4);
      const int r = world.rank();
      const int64_t local = out / tp;
      Tensor dy_local(DType::kFloat32, Shape{T, local});
      for (int64_t t = 0; t < T; ++t)
        std::copy_n(dy.data_as<float>() + t * out + r * local, local,
                    dy_local.data_as<float>() + t * local);
      const int before = counting->all_reduces();
      ys[size_t(r)] = doubles(dense.forward(x));
      EXPECT_EQ(counting->all_reduces() - before, tp == 2 ? 1 : 0);  // W's amax
      const std::vector<double> d = doubles(dense.backward(dy_local));
      if (r == 0) dx[size_t(tp - 1)] = d;
      dws[size_t(r)] = doubles(dense.weight().grad);
    });
    for (int64_t t = 0; t < T; ++t)
      for (int r = 0; r < tp; ++r)
        for (int64_t c = 0; c < out / tp; ++c)
          y[size_t(tp - 1)].push_back(ys[size_t(r)][size_t(t * (out / tp) + c)]);
    for (int r = 0; r < tp; ++r)
      dw[size_t(tp - 1)].insert(dw[size_t(tp - 1)].end(), dws[size_t(r)].begin(),
                                dws[size_t(r)].end());
  }
  // The same quantized operands; the fp32 GEMM's summation order depends on N (a few ulps).
  EXPECT_LT(rel_norm(y[1], y[0]), 1e-6);
  EXPECT_LT(rel_norm(dx[1], dx[0]), 0.3);  // measured 0.197 (two roundings of dy)
  EXPECT_LT(rel_norm(dw[1], dw[0]), 0.3);  // measured 0.167
  EXPECT_NE(dx[1], dx[0]);                 // dy's shards are quantized on their own
}

// Three training steps (plain SGD) in one go, against two steps, a checkpoint, a fresh
// context and layer that load it, and the third step: the same bits (the checkpoint restores
// the step count that seeds stochastic rounding and the RHT).
TEST(Nvfp4Recipe, CheckpointResumesBitForBit) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / "qmesh_nvfp4_recipe_checkpoint").string();
  std::filesystem::remove_all(dir);
  const Tensor x = test::random_tensor(Shape{32, 64}, 1);
  const Tensor dy = test::random_tensor(Shape{32, 32}, 2);
  // Steps [first, last) of training; saves after them when `save`.
  const auto train = [&](Communicator& comm, Dense& dense, LayerContext& ctx, int first, int last) {
    for (int step = first; step < last; ++step) {
      dense.forward(x);
      dense.backward(dy);
      for (Parameter* p : dense.parameters())
        for (int64_t i = 0; i < p->value.numel(); ++i)
          p->value.data_as<float>()[i] -= 0.01f * p->grad.data_as<float>()[i];
      ctx.end_step();
    }
    (void)comm;
    return doubles(dense.weight().value);
  };
  std::vector<double> straight, resumed;
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kNvfp4, emulated());
    Dense dense("d", 64, 32, DenseOptions{}, ctx, 4);
    straight = train(comm, dense, ctx, 0, 3);
  });
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kNvfp4, emulated());
    Dense dense("d", 64, 32, DenseOptions{}, ctx, 4);
    train(comm, dense, ctx, 0, 2);
    CheckpointContent content;
    content.context = &ctx;
    for (Parameter* p : dense.parameters()) content.tensors.push_back({p->name, p->value});
    save_checkpoint(dir, 2, content, comm);
  });
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kNvfp4, emulated());
    Dense dense("d", 64, 32, DenseOptions{}, ctx, 4);  // the same model (and layer seed)
    CheckpointContent content;
    content.context = &ctx;
    for (Parameter* p : dense.parameters()) content.tensors.push_back({p->name, p->value});
    EXPECT_EQ(load_checkpoint(dir, content, comm), 2);
    EXPECT_EQ(ctx.steps(), 2);
    resumed = train(comm, dense, ctx, 2, 3);
  });
  EXPECT_EQ(resumed, straight);
  std::filesystem::remove_all(dir);
}

// LayerNormMLP under NVFP4 (emulated through QMESH_BLOCK_EMULATION=1) at dp 2 x tp 2 and
// fsdp 2 x tp 2 (the gathered fp32 weight cast whole), against the float64 block on the same
// global batch: y and dx within 0.25, the weight gradients within 0.35 (measured: 0.26 for
// fc1's, whose input is the LayerNorm output and whose dy went through GELU's backward).
TEST(Nvfp4Recipe, LayerNormMlpShardedMatchesFloat64Reference) {
  testing_mlp::ShardedCase c;
  c.recipe = Recipe::kNvfp4;
  c.hidden = 32;
  c.ffn = 64;
  c.tokens_per_dp = 16;
  c.steps = 1;
  c.dp = 2;
  c.tp = 2;
  const testing_mlp::MlpRun want = testing_mlp::reference_of(c);  // the 32 tokens of dp 2
  setenv("QMESH_BLOCK_EMULATION", "1", 1);
  for (int fsdp : {1, 2}) {
    SCOPED_TRACE(fsdp == 1 ? "dp 2 x tp 2" : "fsdp 2 x tp 2");
    c.dp = 3 - fsdp;
    c.fsdp = fsdp;
    std::vector<testing_mlp::MlpRun> runs(4);
    run_local_ranks(4, [&](Communicator& comm) {
      runs[size_t(comm.rank())] = testing_mlp::run_sharded(borrowed(comm), c);
    });
    const testing_mlp::MlpRun& got = runs[0];
    EXPECT_LT(rel_norm(got.y, want.y), 0.25);
    EXPECT_LT(rel_norm(got.dx, want.dx), 0.25);
    EXPECT_LT(rel_norm(got.grads.w1, want.grads.w1), 0.35);
    EXPECT_LT(rel_norm(got.grads.w2, want.grads.w2), 0.35);
  }
  unsetenv("QMESH_BLOCK_EMULATION");
}

TEST(Nvfp4Recipe, WithoutEmulationTheGemmIsAnErrorThatSaysHowToAsk) {
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kNvfp4);
    Dense dense("d", 64, 32, DenseOptions{}, ctx, 4);
    const Tensor x = test::random_tensor(Shape{32, 64}, 1);
    EXPECT_QMESH_ERROR(dense.forward(x), "the host backend has no native NVFP4 GEMM");
    EXPECT_QMESH_ERROR(dense.forward(x), "NVFP4BlockScaling(emulate=True)");
  });
}

TEST(Nvfp4Recipe, RefusesWhatItDoesNotSupport) {
  run_local_ranks(1, [&](Communicator& comm) {
    const Mesh mesh(borrowed(comm), {{"tp", 1}});
    Fp8Stats stats;
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kNvfp4, {.fp8_stats = &stats}),
                       "per-tensor scaling only; unset it under the 'nvfp4' recipe");
    NVFP4BlockScaling bad;
    bad.fp8_dpa = true;
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kNvfp4, {.nvfp4 = bad}), "fp8_dpa");
    LayerContext ctx(mesh, Recipe::kNvfp4, emulated());
    Dense dense("d", 64, 32, DenseOptions{}, ctx, 4);
    const Tensor x = test::random_tensor(Shape{20, 64}, 1);  // 20 tokens: not whole blocks
    EXPECT_QMESH_ERROR(dense.forward(x), "multiples of 16");
    DenseOptions sequence_parallel;
    sequence_parallel.parallelism = DenseParallelism::kColumn;
    sequence_parallel.sequence_parallel = true;
    EXPECT_QMESH_ERROR(Dense("sp", 64, 32, sequence_parallel, ctx, 4),
                       "NVFP4 runs without sequence parallelism");
    // Without end_step the seeds would repeat: a second forward after backward is refused.
    const Tensor x32 = test::random_tensor(Shape{32, 64}, 1);
    const Tensor dy = test::random_tensor(Shape{32, 32}, 2);
    dense.forward(x32);
    dense.backward(dy);
    EXPECT_QMESH_ERROR(dense.forward(x32), "repeats the same random bits");
  });
}

}  // namespace
}  // namespace qmesh
