// The layer path on CUDA against the host: each layer op (LayerNorm forward/backward, bias
// gradient and add, GELU and its backward, add, bf16 conversion) and the optimizer steps on
// the same inputs; LayerNormMLP forward + backward for every recipe on a single-rank mesh and
// on a tp = 2 mesh of local-backend threads sharing the GPU (each with its own stream), against
// the host run and the float64 reference; GradSync + AdamW on device gradients. Skipped
// without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "expect_error.h"
#include "layer_norm_run.h"
#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/copy.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/ops/add.h"
#include "qmesh/ops/bias.h"
#include "qmesh/ops/convert.h"
#include "qmesh/ops/gelu.h"
#include "qmesh/ops/layer_norm.h"
#include "qmesh/ops/transpose.h"
#include "qmesh/owned_stream.h"
#include "qmesh/train/grad_sync.h"
#include "qmesh/train/optimizer.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using namespace testing_mlp;

const Device kGpu = Device::cuda(0);

// The fixtures of this file: each test is skipped without a CUDA device.
template <class Base>
class OnGpu : public Base {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};
using LayersGpu = OnGpu<::testing::Test>;

// A stream of its own for the calling thread (one per virtual rank), destroyed with it.
class OwnStream {
 public:
  Stream stream() const { return owned_.get(); }
  void sync() const { synchronize(kGpu, stream()); }

 private:
  OwnedStream owned_{kGpu};
};

using test::LayerNormRun;
using test::random_tensor;

Tensor to_gpu(const TensorView& host) { return clone(host, kGpu); }
Tensor to_host(const TensorView& t) { return clone(t, Device::host()); }

// Element by element: |gpu - host| <= tol * max(1, |host|). gpu is read back to the host.
void expect_close(const TensorView& gpu, const TensorView& host, double tol, const char* what) {
  const Tensor got = to_host(gpu);
  ASSERT_EQ(got.numel(), host.numel()) << what;
  int reported = 0;
  for (int64_t i = 0; i < host.numel() && reported < 10; ++i) {
    const double want = host.data_as<float>()[i], have = got.data_as<float>()[i];
    if (std::abs(have - want) > tol * std::max(1.0, std::abs(want))) {
      ADD_FAILURE() << what << "[" << i << "]: cuda " << have << " vs host " << want;
      ++reported;
    }
  }
}

TEST_F(LayersGpu, LayerNormMatchesTheHost) {
  OwnStream s;
  // 300 rows: more than one row block of the column sums; 1000 columns: several per thread.
  const LayerNormRun host(300, 1000), gpu(300, 1000, kGpu, s.stream());
  s.sync();
  expect_close(gpu.y, host.y, 1e-5, "y");
  expect_close(gpu.mean, host.mean, 1e-5, "mean");
  expect_close(gpu.rstd, host.rstd, 1e-5, "rstd");
  expect_close(gpu.dx, host.dx, 1e-4, "dx");
  expect_close(gpu.dgamma, host.dgamma, 1e-4, "dgamma");  // sums of 300 terms in another order
  expect_close(gpu.dbeta, host.dbeta, 1e-4, "dbeta");
}

// The residual gradient added in the dx pass on the device: the bits of the device's own
// separate add, and the host's result within LayerNorm's tolerance.
TEST_F(LayersGpu, LayerNormBackwardAddsTheResidualAsTheSeparateAdd) {
  OwnStream s;
  const LayerNormRun host(300, 1000), gpu(300, 1000, kGpu, s.stream());
  const Tensor residual = random_tensor(host.x.shape(), 41);
  Tensor want = clone(host.dx, Device::host());
  add(residual, want, want);
  const Tensor gres = to_gpu(residual), gx = to_gpu(host.x), ggamma = to_gpu(host.gamma),
               gdy = to_gpu(host.dy);
  Tensor gdx(DType::kFloat32, host.x.shape(), kGpu), gsum(DType::kFloat32, host.x.shape(), kGpu);
  Tensor gdg(DType::kFloat32, host.gamma.shape(), kGpu),
      gdb(DType::kFloat32, host.gamma.shape(), kGpu);
  layer_norm_backward(gdy, gx, ggamma, gpu.mean, gpu.rstd, gdx, gdg, gdb, s.stream(), gres);
  add(gres, gpu.dx, gsum, s.stream());
  s.sync();
  const Tensor fused = to_host(gdx), separate = to_host(gsum);
  EXPECT_EQ(std::memcmp(fused.data(), separate.data(), fused.nbytes()), 0);
  expect_close(gdx, want, 1e-4, "dx + residual");
}

TEST_F(LayersGpu, BiasOpsMatchTheHost) {
  OwnStream s;
  const int64_t rows = 600, cols = 300;
  const Tensor g = random_tensor(Shape{rows, cols}, 5);
  Tensor dbias(DType::kFloat32, Shape{cols}), gdbias(DType::kFloat32, Shape{cols}, kGpu);
  bias_grad(g, dbias);
  const Tensor gg = to_gpu(g);
  bias_grad(gg, gdbias, s.stream());

  const Tensor bias = random_tensor(Shape{cols}, 6);
  Tensor y = random_tensor(Shape{rows, cols}, 7);
  Tensor gy = to_gpu(y);
  const Tensor gbias = to_gpu(bias);
  add_bias(y, bias);
  add_bias(gy, gbias, s.stream());
  s.sync();
  expect_close(gdbias, dbias, 1e-4, "bias_grad");
  expect_close(gy, y, 0.0, "add_bias");  // one fp32 addition: exact on both
}

TEST_F(LayersGpu, ElementwiseOpsMatchTheHost) {
  OwnStream s;
  const Shape shape{37, 129};
  const Tensor a = random_tensor(shape, 8, -6.0f, 6.0f), b = random_tensor(shape, 9);
  Tensor sum(DType::kFloat32, shape), act(DType::kFloat32, shape), grad(DType::kFloat32, shape);
  add(a, b, sum);
  gelu(a, act);
  dgelu(b, a, grad);
  const Tensor ga = to_gpu(a), gb = to_gpu(b);
  Tensor gsum(DType::kFloat32, shape, kGpu), gact(DType::kFloat32, shape, kGpu);
  Tensor ggrad = to_gpu(b);  // in place: dx aliases dy
  add(ga, gb, gsum, s.stream());
  gelu(ga, gact, s.stream());
  dgelu(ggrad, ga, ggrad, s.stream());
  s.sync();
  expect_close(gsum, sum, 0.0, "add");
  // One fp32 GELU on both, every operation rounded as written (cpu/gelu.h): exact.
  expect_close(gact, act, 0.0, "gelu");
  expect_close(ggrad, grad, 0.0, "dgelu");
}

// bf16 activations: GELU, its backward and the bias add read and write bf16 with the host's
// bits (fp32 math as written in cpu/gelu.h, round to nearest even); widening is exact.
TEST_F(LayersGpu, Bf16ActivationOpsAreBitIdentical) {
  OwnStream s;
  const Shape shape{37, 129};
  auto narrow = [&](const TensorView& t) {
    Tensor out(DType::kBFloat16, t.shape);
    convert_to_bf16(t, out);
    return out;
  };
  const Tensor pre = narrow(random_tensor(shape, 11, -6.0f, 6.0f));
  const Tensor dy = narrow(random_tensor(shape, 12));
  const Tensor bias = random_tensor(Shape{shape.cols()}, 13);
  Tensor act(DType::kBFloat16, shape), grad(DType::kFloat32, shape), wide(DType::kFloat32, shape);
  Tensor y = narrow(random_tensor(shape, 14));
  gelu(pre, act);
  dgelu(dy, pre, grad);
  convert_to_fp32(pre, wide);
  const Tensor gpre = to_gpu(pre), gdy = to_gpu(dy), gbias = to_gpu(bias);
  Tensor gact(DType::kBFloat16, shape, kGpu), ggrad(DType::kFloat32, shape, kGpu);
  Tensor gwide(DType::kFloat32, shape, kGpu), gy = to_gpu(y);
  gelu(gpre, gact, s.stream());
  dgelu(gdy, gpre, ggrad, s.stream());
  convert_to_fp32(gpre, gwide, s.stream());
  add_bias(y, bias);
  add_bias(gy, gbias, s.stream());
  s.sync();
  auto same_bits = [](const TensorView& gpu, const TensorView& host, const char* what) {
    const Tensor got = to_host(gpu);
    EXPECT_EQ(std::memcmp(got.data(), host.data, host.nbytes()), 0) << what;
  };
  same_bits(gact, act, "gelu");
  same_bits(ggrad, grad, "dgelu");
  same_bits(gwide, wide, "convert_to_fp32");
  same_bits(gy, y, "add_bias");
}

TEST_F(LayersGpu, Bf16ConversionIsBitIdentical) {
  OwnStream s;
  Tensor x = random_tensor(Shape{1000}, 10, -1e4f, 1e4f);
  const float specials[] = {0.0f, -0.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 3.4e38f, 1e-40f};
  std::memcpy(x.data(), specials, sizeof(specials));
  Tensor out(DType::kBFloat16, x.shape()), gout(DType::kBFloat16, x.shape(), kGpu);
  convert_to_bf16(x, out);
  convert_to_bf16(to_gpu(x), gout, s.stream());
  s.sync();
  const Tensor got = to_host(gout);
  EXPECT_EQ(std::memcmp(got.data(), out.data(), out.nbytes()), 0);
}

TEST_F(LayersGpu, TransposeMatchesTheHost) {
  OwnStream s;
  for (DType dtype : {DType::kFloat8E4M3, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    for (const Shape& shape : {Shape{37, 70}, Shape{1, 100}, Shape{256, 96}}) {
      Tensor in(dtype, shape), out(dtype, Shape{shape.cols(), shape.rows()});
      auto* p = static_cast<uint8_t*>(in.data());
      for (size_t i = 0; i < in.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 131 + 7);
      Tensor gin(dtype, shape, kGpu), gout(dtype, out.shape(), kGpu);
      copy_tensor(gin, in);
      transpose(in, out);
      transpose(gin, gout, s.stream());
      s.sync();
      const Tensor got = to_host(gout);
      EXPECT_EQ(std::memcmp(got.data(), out.data(), out.nbytes()), 0)
          << dtype_name(dtype) << " " << shape.str();
    }
  }
}

// The same parameters and gradients on the host and on the GPU, `steps` optimizer steps each.
void expect_optimizer_matches(bool adamw) {
  OwnStream s;
  const Shape shape{1000};
  Parameter host{"p", random_tensor(shape, 11), Tensor(DType::kFloat32, shape)};
  Parameter dev{"p", to_gpu(host.value), Tensor(DType::kFloat32, shape, kGpu)};
  auto make = [&](Parameter& p, Stream stream) {
    return adamw ? make_adamw({&p}, AdamWOptions{0.01f, 0.9f, 0.999f, 1e-8f, 0.1f}, stream)
                 : make_sgd({&p}, SgdOptions{0.05f, 0.9f, 0.01f}, stream);
  };
  auto on_host = make(host, {}), on_gpu = make(dev, s.stream());
  for (int step = 0; step < 3; ++step) {
    const Tensor g = random_tensor(shape, 20 + step);
    copy_tensor(host.grad, g);
    copy_tensor(dev.grad, g);  // blocking: the previous step's kernel has finished
    on_host->step();
    on_gpu->step();
    s.sync();
  }
  EXPECT_EQ(on_gpu->steps(), 3);
  // The same float operations; contraction into FMAs may move the last bits.
  expect_close(dev.value, host.value, 1e-6, adamw ? "AdamW weights" : "SGD weights");
}

TEST_F(LayersGpu, AdamWStepMatchesTheHost) { expect_optimizer_matches(true); }
TEST_F(LayersGpu, SgdMomentumStepMatchesTheHost) { expect_optimizer_matches(false); }

// One LayerNormMLP case run by tp threads of the local backend, on the host or the GPU (each
// thread with its own stream, and a second one for the collective GEMMs' transfers); returns
// rank 0's gathered result.
MlpRun run_case(ShardedCase c, bool gpu) {
  const int ranks = c.dp * c.fsdp * c.tp;
  std::vector<MlpRun> runs(static_cast<size_t>(ranks));
  run_local_ranks(ranks, [&](Communicator& comm) {
    OwnStream s, comm_stream;
    ShardedCase mine = c;
    if (gpu) mine.placement = Placement{kGpu, s.stream(), comm_stream.stream()};
    runs[size_t(comm.rank())] = run_sharded(borrowed(comm), mine);
  });
  return runs[0];
}

// A LayerNormMLP case with sizes that suit CUDA's FP8 GEMM: multiples of 16 (its
// leading-dimension rule), also after tp = 2 halves ffn and, with sequence parallelism, the
// tokens (32 / 2).
ShardedCase device_case(Recipe recipe, int dp, int fsdp, int tp, bool sequence_parallel = false) {
  ShardedCase c;
  c.dp = dp;
  c.fsdp = fsdp;
  c.tp = tp;
  c.recipe = recipe;
  c.sequence_parallel = sequence_parallel;
  c.hidden = 32, c.ffn = 64, c.tokens_per_dp = sequence_parallel ? 32 : 16;
  // The block recipe shards whole 128-wide blocks: ffn / tp a multiple of 128.
  if (recipe == Recipe::kFp8Block) c.ffn = 128 * tp;
  return c;
}

struct Tolerance {
  double y, dx, grads;
};

Tolerance tolerance(Recipe recipe) {
  switch (recipe) {
    case Recipe::kFp32:
      return {1e-4, 1e-4, 1e-4};
    case Recipe::kBf16:
      return {2e-2, 2e-2, 2e-2};
    default:  // FP8: the host suite's bounds (docs/numerics.md "Tolerances")
      return {0.05, 0.1, 0.15};
  }
}

void expect_run_close(const MlpRun& got, const MlpRun& want, Tolerance tol,
                      const std::string& what) {
  EXPECT_LT(rel_norm(got.y, want.y), tol.y) << what << ": y";
  EXPECT_LT(rel_norm(got.dx, want.dx), tol.dx) << what << ": dx";
  EXPECT_LT(rel_norm(got.grads.gamma, want.grads.gamma), tol.grads) << what << ": dgamma";
  EXPECT_LT(rel_norm(got.grads.beta, want.grads.beta), tol.grads) << what << ": dbeta";
  EXPECT_LT(rel_norm(got.grads.w1, want.grads.w1), tol.grads) << what << ": dW1";
  EXPECT_LT(rel_norm(got.grads.b1, want.grads.b1), tol.grads) << what << ": db1";
  EXPECT_LT(rel_norm(got.grads.w2, want.grads.w2), tol.grads) << what << ": dW2";
  EXPECT_LT(rel_norm(got.grads.b2, want.grads.b2), tol.grads) << what << ": db2";
}

struct MlpGpuCase {
  int tp;
  Recipe recipe;
  bool sequence_parallel = false;
};

void PrintTo(const MlpGpuCase& c, std::ostream* os) {
  *os << "tp" << c.tp << "_" << recipe_name(c.recipe) << (c.sequence_parallel ? "_sp" : "");
}

class LayerNormMLPGpu : public OnGpu<::testing::TestWithParam<MlpGpuCase>> {};

// Forward + backward of one step (the float64 reference's) and of two steps (delayed scaling
// then quantizes with the scales its first update computed on the device).
TEST_P(LayerNormMLPGpu, MatchesTheHostAndTheFloat64Reference) {
  const MlpGpuCase p = GetParam();
  ShardedCase c = device_case(p.recipe, 1, 1, p.tp, p.sequence_parallel);
  const Tolerance tol = tolerance(p.recipe);
  for (int steps : {1, 2}) {
    c.steps = steps;
    const std::string what = detail::concat(recipe_name(p.recipe), " tp=", p.tp, " steps=", steps);
    const MlpRun gpu = run_case(c, true);
    expect_run_close(gpu, run_case(c, false), tol, detail::concat(what, ", cuda vs host"));
    if (steps == 1)
      expect_run_close(gpu, reference_of(c), tol, detail::concat(what, ", cuda vs float64"));
  }
}

constexpr Recipe kRecipes[] = {Recipe::kFp32, Recipe::kBf16, Recipe::kFp8Delayed,
                               Recipe::kFp8Current};

// A row-parallel layer at tp = 1 with a residual (LayerNormMLP's fc2): on CUDA the same y as
// on the host, the residual and bias in the GEMM where cuBLASLt offers an accumulating GEMM
// with a bias for the recipe's operands (printed: what the GPU offers is recorded, not
// assumed), else in separate passes.
TEST_F(LayersGpu, DenseWithAResidualMatchesTheHost) {
  const Tensor x = random_tensor(Shape{32, 64}, 60), residual = random_tensor(Shape{32, 48}, 61);
  const Tensor bias = random_tensor(Shape{48}, 62);
  for (Recipe recipe : kRecipes) {
    std::vector<double> ys[2];
    for (bool gpu : {false, true}) {
      run_local_ranks(1, [&](Communicator& comm) {
        OwnStream s;
        const Device device = gpu ? kGpu : Device::host();
        LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), recipe,
                         {.placement = Placement{device, gpu ? s.stream() : Stream{}, {}}});
        DenseOptions options;
        options.parallelism = DenseParallelism::kRow;
        Dense dense("fc2", 64, 48, options, ctx, 5);
        copy_tensor(dense.parameters()[1]->value, clone(bias, device));
        const Tensor x_on = clone(x, device), residual_on = clone(residual, device);
        const Tensor y = to_host(dense.forward(x_on, residual_on));
        ys[gpu] = std::vector<double>(y.data_as<float>(), y.data_as<float>() + y.numel());
        if (gpu)
          std::printf("%s: fc2 at tp=1 ran the %s epilogue\n",
                      std::string(recipe_name(recipe)).c_str(),
                      dense_epilogue_name(dense.forward_epilogue()));
      });
    }
    EXPECT_LT(rel_norm(ys[1], ys[0]), tolerance(recipe).y) << recipe_name(recipe);
  }
}

// FSDP on the device: each rank's weight gathers (FP8 codes with an FP8 recipe) and gradient
// reduce-scatters run on its communication stream, ordered against the compute stream with
// events. The result must be what the host computes, and the same bits for every prefetch
// depth and with the gathered weights kept for backward: a missing ordering (a gather that
// reads the shard before its cast, a GEMM that reads the buffer before the gather) would show
// as a difference between them.
struct FsdpGpuCase {
  int dp, fsdp, tp;
  Recipe recipe;
};

void PrintTo(const FsdpGpuCase& c, std::ostream* os) {
  *os << "dp" << c.dp << "_fsdp" << c.fsdp << "_tp" << c.tp << "_" << recipe_name(c.recipe);
}

class FsdpGpu : public OnGpu<::testing::TestWithParam<FsdpGpuCase>> {};

TEST_P(FsdpGpu, MatchesTheHostWithAnyPrefetch) {
  const FsdpGpuCase p = GetParam();
  ShardedCase c = device_case(p.recipe, p.dp, p.fsdp, p.tp);
  const std::string what =
      detail::concat(recipe_name(p.recipe), " dp=", p.dp, " fsdp=", p.fsdp, " tp=", p.tp);
  c.fsdp_options = {false, 0};
  const MlpRun unprefetched = run_case(c, true);
  c.fsdp_options = {true, 2};
  const MlpRun prefetched = run_case(c, true);
  expect_bitwise_equal(prefetched, unprefetched,
                       what + ", prefetch 2 + keep_gathered vs prefetch 0");
  expect_run_close(prefetched, run_case(c, false), tolerance(p.recipe), what + ", cuda vs host");
}

INSTANTIATE_TEST_SUITE_P(Layouts, FsdpGpu,
                         ::testing::Values(FsdpGpuCase{1, 4, 1, Recipe::kFp32},
                                           FsdpGpuCase{1, 4, 1, Recipe::kBf16},
                                           FsdpGpuCase{1, 4, 1, Recipe::kFp8Delayed},
                                           FsdpGpuCase{2, 2, 1, Recipe::kFp8Current},
                                           FsdpGpuCase{1, 2, 2, Recipe::kFp8Delayed}));

// Every recipe at tp = 1 and 2, and with sequence parallelism at tp = 2 (`sp_only`: those,
// block scaling left out).
std::vector<MlpGpuCase> mlp_cases(bool sp_only) {
  std::vector<MlpGpuCase> out;
  for (Recipe r : kRecipes) {
    if (!sp_only) {
      out.push_back({1, r});
      out.push_back({2, r});
    }
    out.push_back({2, r, true});
  }
  // The block recipe: sequence parallelism without the collective GEMMs (they take no
  // block-scaled operands, so no overlap schedules to compare).
  if (!sp_only) {
    out.push_back({1, Recipe::kFp8Block});
    out.push_back({2, Recipe::kFp8Block});
    out.push_back({2, Recipe::kFp8Block, true});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Recipes, LayerNormMLPGpu, ::testing::ValuesIn(mlp_cases(false)));

// Sequence-parallel cases only: a GTEST_SKIP for the others would print "[  SKIPPED ]", which
// makes ctest (SKIP_REGULAR_EXPRESSION of the gpu label) report the whole binary as skipped,
// whatever its failures.
class LayerNormMLPSpGpu : public LayerNormMLPGpu {};

// Sequence parallelism on CUDA: the collective GEMMs' schedules give the same bits on the
// device (ring and bidirectional against none), outputs and every gradient, and so does
// gathering fc1's input again in backward (kRegather, the bulk overlap) instead of keeping it.
TEST_P(LayerNormMLPSpGpu, OverlapSchedulesAreBitwiseEqualOnTheDevice) {
  const MlpGpuCase p = GetParam();
  ShardedCase c = device_case(p.recipe, 1, 1, p.tp, true);
  const MlpRun none = run_case(c, true);
  for (Overlap o : {Overlap::kRing, Overlap::kBidirectional}) {
    c.overlap = o;
    expect_bitwise_equal(run_case(c, true), none, std::string(overlap_name(o)));
  }
  c.gathered_input = GatheredInput::kRegather;
  for (Overlap o : {Overlap::kNone, Overlap::kRing}) {
    c.overlap = o;
    expect_bitwise_equal(run_case(c, true), none,
                         detail::concat("regather with ", overlap_name(o)));
  }
}

INSTANTIATE_TEST_SUITE_P(Recipes, LayerNormMLPSpGpu, ::testing::ValuesIn(mlp_cases(true)));

// A sequence-parallel layer on CUDA needs the second stream.
TEST_F(LayersGpu, SequenceParallelNeedsACommStream) {
  OwnStream s;
  run_local_ranks(1, [&](Communicator& comm) {
    Mesh mesh(borrowed(comm), {{"dp", 1}, {"tp", 1}});
    LayerContext ctx(mesh, Recipe::kBf16, {.placement = Placement{kGpu, s.stream(), {}}});
    EXPECT_QMESH_ERROR(LayerNormMLP("mlp", 32, 64, {true, 1e-5f, std::nullopt}, ctx, 1),
                       "comm_stream");
    LayerContext same(mesh, Recipe::kBf16, {.placement = Placement{kGpu, s.stream(), s.stream()}});
    EXPECT_QMESH_ERROR(LayerNormMLP("mlp", 32, 64, {true, 1e-5f, std::nullopt}, same, 1),
                       "comm_stream");
  });
}

// Two data-parallel ranks on one GPU: bucketed all-reduce of device gradients, then AdamW on
// the device, equal to the same on the host.
TEST_F(LayersGpu, GradSyncAndAdamWOnDeviceMatchTheHost) {
  const int ranks = 2;
  const Shape shapes[] = {Shape{300}, Shape{17, 5}, Shape{2000}};
  std::vector<Tensor> host_result;  // rank 0's weights after the host run
  for (bool gpu : {false, true}) {
    std::vector<std::vector<Tensor>> results(ranks);
    run_local_ranks(ranks, [&](Communicator& comm) {
      OwnStream s;
      const Device device = gpu ? kGpu : Device::host();
      const Stream stream = gpu ? s.stream() : Stream{};
      std::vector<Parameter> params;
      for (size_t i = 0; i < std::size(shapes); ++i)
        params.push_back({detail::concat("p", i), clone(random_tensor(shapes[i], 30 + i), device),
                          clone(random_tensor(shapes[i], 40 + i + 10 * comm.rank()), device)});
      std::vector<Parameter*> ptrs;
      for (auto& p : params) ptrs.push_back(&p);
      GradSync sync(borrowed(comm), ptrs, 4096, stream);  // 4 KiB: several buckets
      EXPECT_GT(sync.bucket_count(), 1u);
      auto opt = make_adamw(ptrs, AdamWOptions{}, stream);
      for (auto it = ptrs.rbegin(); it != ptrs.rend(); ++it) sync.ready({*it});
      sync.finish();
      opt->step();
      synchronize(device, stream);
      for (auto& p : params) results[size_t(comm.rank())].push_back(to_host(p.value));
    });
    if (!gpu) {
      host_result = std::move(results[0]);
      continue;
    }
    for (int r = 0; r < ranks; ++r)
      for (size_t i = 0; i < host_result.size(); ++i)
        expect_close(results[size_t(r)][i], host_result[i], 1e-6,
                     detail::concat("rank ", r, " p", i).c_str());
  }
}

TEST_F(LayersGpu, MisplacedInputsAreClearErrors) {
  run_local_ranks(1, [&](Communicator& comm) {
    Mesh mesh(borrowed(comm), {{"dp", 1}, {"tp", 1}});
    LayerContext ctx(mesh, Recipe::kBf16, {.placement = Placement{kGpu, {}, {}}});
    LayerNormMLP block("mlp", 32, 64, {}, ctx, 1);
    const Tensor host_x = random_tensor(Shape{16, 32}, 50);
    EXPECT_QMESH_ERROR(block.forward(host_x), "cuda:0");
    EXPECT_QMESH_ERROR(LayerNormMLP("sp", 32, 64, {true, 1e-5f, std::nullopt}, ctx, 1),
                       "sequence_parallel");
    Parameter on_host{"h", random_tensor(Shape{4}, 51), Tensor(DType::kFloat32, Shape{4})};
    Parameter on_gpu{"g", to_gpu(on_host.value), to_gpu(on_host.grad)};
    EXPECT_QMESH_ERROR(GradSync(borrowed(comm), {&on_gpu, &on_host}), "one device");
  });
}

}  // namespace
}  // namespace qmesh
