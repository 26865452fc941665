// Fully sharded data parallelism: the shard layout, and training that is bit-identical for
// dp = 4, fsdp = 4 and dp = 2 x fsdp = 2 (tp 1 and 2; fp32, bf16 and both FP8 recipes; sizes
// that fsdp does not divide), on the local backend. The rank-ordered reductions it relies on
// are tested in tests/unit/comm/ordered_reduce_test.cpp.
#include "qmesh/layers/fsdp.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "counting_communicator.h"
#include "expect_error.h"
#include "intercepting_communicator.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/random.h"
#include "qmesh/train/grad_sync.h"
#include "qmesh/train/loss.h"
#include "qmesh/train/optimizer.h"

namespace qmesh {
namespace {

std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

float value_of(int rank, int64_t i) { return counter_normal(uint64_t(rank) + 11, uint64_t(i)); }

// The definition: every element summed in rank order, ((x0 + x1) + x2) + ..., in float.
float rank_order_sum(int ranks, int64_t i) {
  float sum = value_of(0, i);
  for (int r = 1; r < ranks; ++r) sum += value_of(r, i);
  return sum;
}

// One mesh layout of the data-parallel ranks (dp x fsdp) and tp.
struct Layout {
  int dp, fsdp, tp;
  bool fsdp_outer = false;         // the fsdp axis before the dp axis
  bool sequence_parallel = false;  // tokens sharded over tp
};

std::vector<MeshAxis> axes_of(const Layout& l) {
  std::vector<MeshAxis> axes;
  if (l.fsdp_outer)
    axes = {{"fsdp", l.fsdp}, {"dp", l.dp}};
  else
    axes = {{"dp", l.dp}, {"fsdp", l.fsdp}};
  axes.push_back({"tp", l.tp});
  return axes;
}

MeshResource roles_of(const Layout& l) {
  MeshResource roles;
  if (l.fsdp > 1) roles.fsdp = "fsdp";
  return roles;
}

TEST(FsdpGroup, ShardsGatherAndReduceScatterAnyLayout) {
  const int64_t n = 23;  // not divided by 4: padded shards
  for (const Layout& l : {Layout{1, 4, 1}, Layout{2, 2, 1}, Layout{2, 2, 1, true}}) {
    run_local_ranks(l.dp * l.fsdp, [&](Communicator& world) {
      Mesh mesh(borrow(world), axes_of(l), roles_of(l));
      FsdpGroup g(mesh);
      ASSERT_TRUE(g.enabled());
      EXPECT_EQ(g.size(), l.fsdp);
      const int64_t s = g.shard_numel(n);
      EXPECT_EQ(s % l.dp, 0);
      EXPECT_GE(s * l.fsdp, n);
      EXPECT_LT(s * l.fsdp - n, l.fsdp * l.dp);
      // A replicated tensor: shard it and gather it back.
      Tensor full(DType::kFloat32, Shape{n});
      for (int64_t i = 0; i < n; ++i) full.data_as<float>()[i] = value_of(99, i);
      Tensor gathered(DType::kFloat32, Shape{s * l.fsdp});
      g.all_gather(g.shard_of(full), gathered);
      for (int64_t i = 0; i < s * l.fsdp; ++i)
        ASSERT_EQ(gathered.data_as<float>()[i], i < n ? value_of(99, i) : 0.0f);
      // Each data rank's gradient of the whole tensor (padding zero), reduce-scattered.
      for (int64_t i = 0; i < s * l.fsdp; ++i)
        gathered.data_as<float>()[i] = i < n ? value_of(g.data_rank(), i) : 0.0f;
      Tensor grad(DType::kFloat32, Shape{s});
      g.reduce_scatter(gathered, grad);
      for (int64_t i = 0; i < s; ++i) {
        const int64_t e = g.rank() * s + i;
        ASSERT_EQ(grad.data_as<float>()[i], e < n ? rank_order_sum(g.data_size(), e) : 0.0f)
            << "element " << e;
      }
    });
  }
}

// A transport whose sends read their buffer until they complete and cannot be withdrawn (an
// MPI rendezvous send): each poll of an unfinished send reads the whole buffer.
class ReadingSendCommunicator : public testing::InterceptingCommunicator {
 public:
  explicit ReadingSendCommunicator(std::shared_ptr<Communicator> inner)
      : InterceptingCommunicator(
            std::move(inner), [](Call, int64_t) {}, false) {}

  WorkHandle send_async(TensorView in, int peer, int tag, Stream stream) override {
    return std::make_unique<ReadingSend>(
        in, InterceptingCommunicator::send_async(in, peer, tag, stream), *this);
  }
  std::shared_ptr<Communicator> split(int color, int key) override {
    auto child = InterceptingCommunicator::split(color, key);
    return child ? std::make_shared<ReadingSendCommunicator>(std::move(child)) : nullptr;
  }

 private:
  class ReadingSend : public Work {
   public:
    ReadingSend(TensorView buf, WorkHandle inner, const Communicator& issuer)
        : Work("reading send", issuer), buf_(buf), inner_(std::move(inner)) {}
    ~ReadingSend() override { drop_unfinished(); }

   protected:
    bool poll() override {
      volatile char sink = 0;
      for (size_t i = 0; i < buf_.nbytes(); ++i)
        sink = sink ^ static_cast<const char*>(buf_.data)[i];
      return inner_->test();
    }

   private:
    TensorView buf_;
    WorkHandle inner_;
  };
};

// A reduce-scatter that fails (here: the other ranks never join, so the wait times out) and is
// then dropped keeps the buffers its sends read alive until the sends are dropped: under
// AddressSanitizer, a read of a freed buffer fails the test.
TEST(FsdpGroup, ADroppedFailedReduceScatterNeverReadsFreedBuffers) {
  const Layout l{2, 2, 1};  // dp outer: the gradient is rearranged into a scratch buffer
  run_local_ranks(4, [&](Communicator& world) {
    world.set_timeout(std::chrono::milliseconds(100));
    auto reading = std::make_shared<ReadingSendCommunicator>(borrow(world));
    Mesh mesh(reading, axes_of(l), roles_of(l));
    FsdpGroup g(mesh);
    if (world.rank() != 0) return;
    const int64_t s = g.shard_numel(13);
    Tensor full(DType::kFloat32, Shape{s * l.fsdp}), shard(DType::kFloat32, Shape{s});
    std::fill_n(full.data_as<float>(), full.numel(), 1.0f);
    WorkHandle work = g.reduce_scatter_async(full, shard);
    EXPECT_QMESH_ERROR(work->wait(), "timed out");
    work.reset();
  });
}

// ---- Training: every layout gives the same bits ----

constexpr int64_t kHidden = 10, kFfn = 22, kTokensPerRank = 6;  // sizes fsdp does not divide
constexpr int kBlocks = 2, kSteps = 3;

// The global batch of a step: [data ranks * tokens, hidden]; each data rank takes its rows.
float input_at(int step, int64_t i) { return counter_normal(1000 + uint64_t(step), uint64_t(i)); }
float target_at(int step, int64_t i) {
  return 0.5f * counter_normal(2000 + uint64_t(step), uint64_t(i));
}

// Every parameter's tp-local values after training, per tp rank: "tp<t>:<name>" -> values.
using Trained = std::map<std::string, std::vector<float>>;

// The model's feature sizes and the tokens of each data rank.
struct Sizes {
  int64_t hidden = kHidden, ffn = kFfn, tokens = kTokensPerRank;
};

Trained train(const Layout& l, Recipe recipe, FsdpOptions fsdp_options = {},
              std::shared_ptr<std::atomic<int64_t>> gather_bytes = nullptr, Sizes sizes = {}) {
  const int64_t hidden = sizes.hidden, tokens = sizes.tokens;
  Trained result;
  std::mutex mu;
  run_local_ranks(l.dp * l.fsdp * l.tp, [&](Communicator& world) {
    std::shared_ptr<Communicator> base = borrow(world);
    if (gather_bytes)
      base = std::make_shared<testing::CountingCommunicator>(base, true, gather_bytes);
    Mesh mesh(base, axes_of(l), roles_of(l));
    MXFP8BlockScaling mxfp8;
    mxfp8.emulate = true;  // the host runs MXFP8 GEMMs emulated only
    LayerContext ctx(mesh, recipe, {.mxfp8 = mxfp8, .fsdp = fsdp_options});
    LayerNormMLPOptions block_options;
    block_options.sequence_parallel = l.sequence_parallel;
    std::vector<LayerNormMLP> blocks;
    for (int b = 0; b < kBlocks; ++b)
      blocks.emplace_back("block" + std::to_string(b), hidden, sizes.ffn, block_options, ctx,
                          uint64_t(b + 1));
    std::vector<Parameter*> all, replicated;  // in the order gradients become ready
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
      for (Parameter* p : it->parameters()) {
        all.push_back(p);
        if (!p->fsdp_sharded()) replicated.push_back(p);
      }
    const FsdpGroup& fsdp = ctx.fsdp();
    GradSync sync(fsdp.data_group(), replicated, 256, {}, GradSyncOrder::kRankOrder);
    auto optimizer = make_adamw(all, AdamWOptions{1e-2f, 0.9f, 0.999f, 1e-8f, 0.01f});
    const int data_ranks = fsdp.data_size();
    const int64_t rows = l.sequence_parallel ? tokens / l.tp : tokens;
    Tensor x(DType::kFloat32, Shape{rows, hidden}), target(DType::kFloat32, Shape{rows, hidden});
    Tensor dy(DType::kFloat32, Shape{rows, hidden}), sum_sq(DType::kFloat64, Shape{1});
    for (int step = 0; step < kSteps; ++step) {
      const int64_t first =
          (fsdp.data_rank() * tokens + (l.sequence_parallel ? mesh.coord("tp") * rows : 0)) *
          hidden;
      for (int64_t i = 0; i < rows * hidden; ++i) {
        x.data_as<float>()[i] = input_at(step, first + i);
        target.data_as<float>()[i] = target_at(step, first + i);
      }
      TensorView h = x;
      for (auto& b : blocks) h = b.forward(h);
      mse_loss(h, target, double(data_ranks * tokens * hidden), dy, sum_sq);
      TensorView g = dy;
      for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
        g = it->backward(g);
        std::vector<Parameter*> ready;
        for (Parameter* p : it->parameters())
          if (!p->fsdp_sharded()) ready.push_back(p);
        sync.ready(ready);
      }
      sync.finish();
      ctx.end_step();
      optimizer->step();
    }
    // Gather the shards back; data rank 0 of each tp rank reports.
    const int tp_rank = mesh.coord("tp");
    for (Parameter* p : all) {
      const Tensor full = fsdp.full_value(*p);
      const std::vector<float> values(full.data_as<float>(), full.data_as<float>() + full.numel());
      if (fsdp.data_rank() == 0) {
        std::lock_guard<std::mutex> lock(mu);
        result["tp" + std::to_string(tp_rank) + ":" + p->name] = values;
      }
    }
  });
  return result;
}

void expect_same_bits(const Trained& a, const Trained& b, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, va] : a) {
    const std::vector<float>& vb = b.at(name);
    ASSERT_EQ(va.size(), vb.size()) << what << " " << name;
    ASSERT_EQ(std::memcmp(va.data(), vb.data(), va.size() * sizeof(float)), 0)
        << what << ": " << name << " differs";
  }
}

// (recipe, tp, sequence parallel)
class FsdpTraining : public ::testing::TestWithParam<std::tuple<Recipe, std::pair<int, bool>>> {};

TEST_P(FsdpTraining, DpFsdpAndBothGiveTheSameBits) {
  const auto [recipe, tp_sp] = GetParam();
  const auto [tp, sp] = tp_sp;
  const Trained dp = train({4, 1, tp, false, sp}, recipe);
  const Trained fsdp = train({1, 4, tp, false, sp}, recipe);
  const Trained both = train({2, 2, tp, false, sp}, recipe);
  const Trained kept = train({2, 2, tp, false, sp}, recipe, FsdpOptions{true, 2});
  const Trained no_prefetch = train({1, 4, tp, false, sp}, recipe, FsdpOptions{false, 0});
  // The parameters moved (the comparison is not between untrained copies).
  const std::vector<float>& w = dp.at("tp0:block0.fc1.weight");
  float first = counter_normal(3, 0) / std::sqrt(float(kHidden));
  EXPECT_NE(w[0], first);
  expect_same_bits(dp, fsdp, "dp=4 vs fsdp=4");
  expect_same_bits(dp, both, "dp=4 vs dp=2 x fsdp=2");
  expect_same_bits(dp, kept, "dp=4 vs dp=2 x fsdp=2 keeping the gathered weights, prefetch 2");
  expect_same_bits(dp, no_prefetch, "dp=4 vs fsdp=4 without prefetch");
}

INSTANTIATE_TEST_SUITE_P(
    Recipes, FsdpTraining,
    ::testing::Combine(
        ::testing::Values(Recipe::kFp32, Recipe::kBf16, Recipe::kFp8Delayed, Recipe::kFp8Current),
        ::testing::Values(std::pair{1, false}, std::pair{2, false}, std::pair{2, true})),
    [](const auto& p) {
      return std::string(recipe_name(std::get<0>(p.param))) + "_tp" +
             std::to_string(std::get<1>(p.param).first) +
             (std::get<1>(p.param).second ? "_sp" : "");
    });

// Block scaling with shards that cut the 128x128 tiles gathers the fp32 weight shards and
// block-casts the gathered weight: the same bits for every layout too (tp = 1: the sizes here
// are not whole 128-wide blocks per tp shard).
INSTANTIATE_TEST_SUITE_P(BlockRecipe, FsdpTraining,
                         ::testing::Combine(::testing::Values(Recipe::kFp8Block),
                                            ::testing::Values(std::pair{1, false})),
                         [](const auto&) { return std::string("block_tp1"); });

// Block scaling with shards of whole 128-row tile rows (weights [512, 512], fsdp 2 and 4; tp 2
// with sequence parallelism: [256, 512] and [512, 256] per tp rank, fsdp 2): every rank
// block-casts its shard and the codes and tile scales are gathered, bitwise the block cast of
// the whole weight, so every layout trains to the bits of plain data parallelism (no FSDP).
TEST(FsdpTraining, BlockRecipeGathersTileCodesAndScales) {
  const Sizes tiles{512, 512};
  const Trained dp = train({4, 1, 1}, Recipe::kFp8Block, {}, nullptr, tiles);
  expect_same_bits(dp, train({1, 4, 1}, Recipe::kFp8Block, {}, nullptr, tiles), "dp=4 vs fsdp=4");
  expect_same_bits(dp, train({2, 2, 1}, Recipe::kFp8Block, {}, nullptr, tiles),
                   "dp=4 vs dp=2 x fsdp=2");
  expect_same_bits(dp, train({2, 2, 1}, Recipe::kFp8Block, FsdpOptions{true, 2}, nullptr, tiles),
                   "dp=4 vs dp=2 x fsdp=2 keeping the gathered weights");
  const Trained dp_tp = train({2, 1, 2, false, true}, Recipe::kFp8Block, {}, nullptr, tiles);
  expect_same_bits(dp_tp, train({1, 2, 2, false, true}, Recipe::kFp8Block, {}, nullptr, tiles),
                   "tp=2 with sequence parallelism: dp=2 vs fsdp=2");
}

// The weight gathers of block scaling with whole tile rows move the FP8 codes and one fp32 scale
// per 128x128 tile: a quarter of fp32's bytes, plus the scales.
// MXFP8 gathers the fp32 weight shards and casts the gathered weight, rowwise only in forward
// (dgrad, in backward, reads the columnwise copy): fsdp trains to the bits of plain data
// parallelism (sizes multiples of MXFP8's 32-element blocks, GEMMs emulated).
TEST(FsdpTraining, Mxfp8RecipeGivesTheBitsOfDataParallelism) {
  const Sizes sizes{64, 96, 32};
  const Trained dp = train({2, 1, 1}, Recipe::kMxfp8, {}, nullptr, sizes);
  expect_same_bits(dp, train({1, 2, 1}, Recipe::kMxfp8, {}, nullptr, sizes), "dp=2 vs fsdp=2");
  expect_same_bits(dp, train({1, 2, 1}, Recipe::kMxfp8, FsdpOptions{true, 1}, nullptr, sizes),
                   "dp=2 vs fsdp=2 keeping the gathered weights");
}

TEST(FsdpTraining, BlockTileGatherMovesAQuarterOfFp32) {
  const Sizes tiles{512, 512};
  auto bf16_bytes = std::make_shared<std::atomic<int64_t>>(0);
  auto block_bytes = std::make_shared<std::atomic<int64_t>>(0);
  auto fp32_bytes = std::make_shared<std::atomic<int64_t>>(0);
  train({1, 4, 1}, Recipe::kBf16, {}, bf16_bytes, tiles);
  train({1, 4, 1}, Recipe::kFp8Block, {}, block_bytes, tiles);
  train({1, 4, 1}, Recipe::kFp32, {}, fp32_bytes, tiles);
  // As below: fp32 = 4w + c, bf16 = 2w + c (c: what every recipe gathers alike).
  const int64_t c = 2 * *bf16_bytes - *fp32_bytes;
  const int64_t fp32_weights = *fp32_bytes - c, block_weights = *block_bytes - c;
  ASSERT_GT(fp32_weights, 0);
  // Per weight gather: fp32 512 x 512 x 4 bytes; block scaling 512 x 512 codes plus 4 tile
  // rows x 4 tile columns (no padding) x 4 bytes of scales.
  constexpr int64_t fp32_gather = 512 * 512 * 4, block_gather = 512 * 512 + 4 * 4 * 4;
  EXPECT_EQ(block_weights * fp32_gather, fp32_weights * block_gather);
}

// The weight all-gathers of one training run move FP8 codes: half the bytes of bf16.
TEST(FsdpTraining, Fp8WeightGatherMovesHalfTheBytesOfBf16) {
  auto bf16_bytes = std::make_shared<std::atomic<int64_t>>(0);
  auto fp8_bytes = std::make_shared<std::atomic<int64_t>>(0);
  auto fp32_bytes = std::make_shared<std::atomic<int64_t>>(0);
  train({1, 4, 1}, Recipe::kBf16, {}, bf16_bytes);
  train({1, 4, 1}, Recipe::kFp8Current, {}, fp8_bytes);
  train({1, 4, 1}, Recipe::kFp32, {}, fp32_bytes);
  // Per run, gathered bytes = weight codes + what every recipe gathers alike (the fp32
  // biases, the final gather of the results): fp32 = 4w + c, bf16 = 2w + c, so c = 2 bf16 - fp32;
  // FP8 must then gather w bytes of weights, half of bf16's 2w.
  const int64_t b = 2 * *bf16_bytes - *fp32_bytes;
  ASSERT_GT(b, 0);
  ASSERT_GT(*bf16_bytes - b, 0);
  EXPECT_EQ(2 * (*fp8_bytes - b), *bf16_bytes - b);
}

// A layer's forward starts the gathers of the next `prefetch` layers before it computes.
TEST(Fsdp, ForwardStartsTheNextLayersGathers) {
  for (int prefetch : {0, 1, 2}) {
    auto bytes = std::make_shared<std::atomic<int64_t>>(0);
    run_local_ranks(2, [&](Communicator& world) {
      auto counting = std::make_shared<testing::CountingCommunicator>(borrow(world), true, bytes);
      Mesh mesh(counting, {{"fsdp", 2}}, MeshResource{"", "", "fsdp", ""});
      LayerContext ctx(mesh, Recipe::kFp32, {.fsdp = FsdpOptions{false, prefetch}});
      const DenseOptions no_bias{DenseParallelism::kNone, false,        false,
                                 DenseActivation::kNone,  std::nullopt, GatheredInput::kSave};
      std::vector<Dense> layers;
      for (int i = 0; i < 3; ++i)
        layers.emplace_back("d" + std::to_string(i), 6, 6, no_bias, ctx, 1);
      Tensor x(DType::kFloat32, Shape{2, 6});
      std::fill_n(x.data_as<float>(), x.numel(), 1.0f);
      world.barrier();
      const int64_t before = *bytes;
      world.barrier();  // both ranks read the count before either gathers
      layers[0].forward(x);
      // fp32 weights of 36 elements: shards of 18 floats; every rank counts its own sends.
      const int64_t gathered = int64_t(std::min(1 + prefetch, 3)) * 18 * 4 * 2;
      world.barrier();
      if (world.rank() == 0) {
        EXPECT_EQ(*bytes - before, gathered) << "prefetch " << prefetch;
      }
      world.barrier();
      layers[1].forward(layers[0].forward(x));  // the prefetched gathers are consumed
    });
  }
}

TEST(Fsdp, NegativePrefetchIsAnError) {
  run_local_ranks(1, [&](Communicator& world) {
    Mesh mesh(borrow(world), {{"fsdp", 1}}, MeshResource{"", "", "fsdp", ""});
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kFp32, {.fsdp = FsdpOptions{false, -1}}),
                       "prefetch must be >= 0");
  });
}

// Every parameter of LayerNormMLP and LayerNormDense, LayerNorm's gamma and beta included, and
// its AdamW moments are held as this rank's zero-padded 1/fsdp shard; gathered back, LayerNorm's
// parameters are their unsharded initial values (gamma 1, beta 0).
TEST(Fsdp, EveryParameterAndItsOptimizerStateIsAPaddedShard) {
  for (const Layout& l : {Layout{1, 4, 1}, Layout{2, 2, 2}}) {
    run_local_ranks(l.dp * l.fsdp * l.tp, [&](Communicator& world) {
      Mesh mesh(borrow(world), axes_of(l), roles_of(l));
      LayerContext ctx(mesh, Recipe::kFp8Delayed);
      LayerNormMLP mlp("mlp", kHidden, kFfn, {}, ctx, 1);
      LayerNormDense qkv("qkv", kHidden, 3 * kFfn, false, ctx, 2);
      std::vector<Parameter*> params = mlp.parameters();
      for (Parameter* p : qkv.parameters()) params.push_back(p);
      // The tp-local sizes (fc1 and the qkv projection are column parallel, fc2 row parallel).
      const std::map<std::string, int64_t> local = {{"mlp.ln.gamma", kHidden},
                                                    {"mlp.ln.beta", kHidden},
                                                    {"mlp.fc1.weight", kFfn / l.tp * kHidden},
                                                    {"mlp.fc1.bias", kFfn / l.tp},
                                                    {"mlp.fc2.weight", kHidden * kFfn / l.tp},
                                                    {"mlp.fc2.bias", kHidden},
                                                    {"qkv.ln.gamma", kHidden},
                                                    {"qkv.ln.beta", kHidden},
                                                    {"qkv.dense.weight", 3 * kFfn / l.tp * kHidden},
                                                    {"qkv.dense.bias", 3 * kFfn / l.tp}};
      ASSERT_EQ(params.size(), local.size());
      // ceil(n / fsdp), rounded up to a multiple of dp: 1/fsdp of n plus less than fsdp x dp.
      std::map<std::string, int64_t> shard;
      for (const auto& [name, n] : local)
        shard[name] = ((n + l.fsdp - 1) / l.fsdp + l.dp - 1) / l.dp * l.dp;
      for (Parameter* p : params) {
        SCOPED_TRACE(p->name);
        ASSERT_TRUE(p->fsdp_sharded());
        EXPECT_EQ(p->fsdp_numel, local.at(p->name));
        EXPECT_EQ(p->value.numel(), shard.at(p->name));
        EXPECT_EQ(p->grad.numel(), shard.at(p->name));
      }
      auto adamw = make_adamw(params, {});
      int moments = 0;
      for (const auto& [name, tensor] : adamw->state()) {
        if (name == "optimizer.step") continue;
        const std::string param = name.substr(0, name.rfind('.'));
        EXPECT_EQ(tensor->numel(), shard.at(param)) << name;
        ++moments;
      }
      EXPECT_EQ(moments, 2 * int(params.size()));
      for (Parameter* p : {params[0], params[1]}) {  // mlp.ln.gamma, mlp.ln.beta
        const Tensor full = ctx.fsdp().full_value(*p);
        ASSERT_EQ(full.numel(), kHidden);
        for (int64_t i = 0; i < kHidden; ++i)
          ASSERT_EQ(full.data_as<float>()[i], p == params[0] ? 1.0f : 0.0f) << p->name;
        const int64_t padding_begin =
            std::max<int64_t>(0, kHidden - ctx.fsdp().rank() * p->value.numel());
        for (int64_t i = padding_begin; i < p->value.numel(); ++i)
          ASSERT_EQ(p->value.data_as<float>()[i], 0.0f) << p->name << " padding " << i;
      }
    });
  }
}

TEST(Fsdp, ShardedParametersAreRejectedByGradSync) {
  run_local_ranks(2, [&](Communicator& world) {
    Mesh mesh(borrow(world), {{"fsdp", 2}}, MeshResource{"", "", "fsdp", ""});
    LayerContext ctx(mesh, Recipe::kFp32);
    LayerNormMLP block("b", 8, 8, {}, ctx, 1);
    EXPECT_QMESH_ERROR(GradSync(mesh.world(), block.parameters()), "is fsdp-sharded");
  });
}

}  // namespace
}  // namespace qmesh
