// The fused delayed-scaling update against a float64 reference of docs/numerics.md's rules
// ("Delayed scaling"), written out step by step here, over random and adversarial amax sequences.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "qmesh/fp8.h"
#include "qmesh/ops/quantize.h"
#include "qmesh/scaling/current_scaling.h"
#include "qmesh/scaling/scaling_states.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// One operand's delayed-scaling state, in float64.
struct Reference {
  std::vector<double> history;  // history[0] = this step's amax
  double scale = 1.0;

  explicit Reference(int len) : history(len, 0.0) {}

  void step(const DelayedScaling& r, double fp8_max) {
    const double current = history[0];
    if (current == 0.0) return;  // the module did not run: no roll, same scale
    double amax = current;
    if (r.amax_compute_algo == AmaxComputeAlgo::kMax) {
      amax = 0.0;  // a NaN in the window is skipped; an all-NaN window leaves 0
      for (double h : history)
        if (!std::isnan(h)) amax = std::max(amax, h);
    }
    std::vector<double> rolled(history.size());
    for (size_t j = 0; j + 1 < history.size(); ++j) rolled[j] = history[j + 1];
    rolled.back() = history[0];
    rolled[0] = 0.0;
    history = rolled;
    if (!(amax > 0.0) || !std::isfinite(amax)) return;  // keep the previous scale
    // The margin scales fp8_max before the division (exact: a power of two times 448 or
    // 57344), then one fp32 division.
    const double scaled_max = static_cast<float>(fp8_max * std::exp2(-double(r.margin)));
    const double quotient = scaled_max / amax;
    scale = std::isinf(static_cast<float>(quotient)) ? FLT_MAX : quotient;
  }
};

// Amax sequences: log-uniform values mixed with the cases the rules single out.
float next_amax(std::mt19937& rng, bool adversarial) {
  std::uniform_real_distribution<double> log2_value(-40.0, 40.0);
  if (!adversarial) return static_cast<float>(std::exp2(log2_value(rng)));
  const float specials[] = {0.0f,
                            kNan,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            1e-40f,  // denormal: 448 / amax overflows fp32
                            std::numeric_limits<float>::denorm_min(),
                            1e-37f,  // normal, but 448 / amax > FLT_MAX
                            FLT_MIN,
                            FLT_MAX,
                            3e-36f,  // 448 / amax just below FLT_MAX: margins matter
                            1.0f};
  std::uniform_int_distribution<int> pick(0, 2 * int(std::size(specials)));
  const int k = pick(rng);
  return k < int(std::size(specials)) ? specials[k]
                                      : static_cast<float>(std::exp2(log2_value(rng)));
}

// (margin, history length, algorithm, adversarial)
using UpdateParam = std::tuple<int, int, AmaxComputeAlgo, bool>;

class DelayedUpdateTest : public ::testing::TestWithParam<UpdateParam> {};

TEST_P(DelayedUpdateTest, MatchesFloat64Reference) {
  const auto [margin, len, algo, adversarial] = GetParam();
  DelayedScaling recipe;
  recipe.margin = float(margin);
  recipe.amax_history_len = len;
  recipe.amax_compute_algo = algo;
  const std::vector<OperandRole> roles = {OperandRole::kInput, OperandRole::kWeight,
                                          OperandRole::kGradOutput, OperandRole::kInput,
                                          OperandRole::kGradOutput};
  const int n = int(roles.size());
  ScalingStates states(recipe, roles);
  std::vector<Reference> ref(n, Reference(len));
  std::mt19937 rng(1234 + margin * 7 + len);
  std::bernoulli_distribution skipped(0.1);  // a module that did not run this step
  const int steps = len + 100;
  float* history = states.amax_history().data_as<float>();
  const float* scale = states.scale().data_as<float>();
  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < n; ++i) {
      const float a = skipped(rng) ? 0.0f : next_amax(rng, adversarial);
      history[i] = a;  // what quantize + the global reduction leave in row 0
      ref[i].history[0] = a;
    }
    states.update();
    for (int i = 0; i < n; ++i) {
      ref[i].step(recipe, fp8_max(states.dtype(i)));
      const float got_scale = scale[i * QuantizedTensor::kScalarSlot];
      ASSERT_TRUE(test::same_bits(got_scale, static_cast<float>(ref[i].scale)))
          << "step " << step << " operand " << i << ": got " << got_scale << ", expected "
          << ref[i].scale;
      for (int j = 0; j < len; ++j) {
        const float got = history[int64_t(j) * n + i];
        const auto want = static_cast<float>(ref[i].history[j]);
        ASSERT_TRUE(test::same_bits(got, want) || (std::isnan(got) && std::isnan(want)))
            << "step " << step << " operand " << i << " history[" << j << "]";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Rules, DelayedUpdateTest,
    ::testing::Combine(::testing::Values(0, 1, 2, 3), ::testing::Values(1, 16, 1024),
                       ::testing::Values(AmaxComputeAlgo::kMax, AmaxComputeAlgo::kMostRecent),
                       ::testing::Bool()),
    [](const ::testing::TestParamInfo<UpdateParam>& p) {
      return "margin" + std::to_string(std::get<0>(p.param)) + "_len" +
             std::to_string(std::get<1>(p.param)) +
             (std::get<2>(p.param) == AmaxComputeAlgo::kMax ? "_max" : "_most_recent") +
             (std::get<3>(p.param) ? "_adversarial" : "_random");
    });

TEST(DelayedUpdate, FirstStepUsesScaleOneAndHybridFormats) {
  ScalingStates states(DelayedScaling{}, {OperandRole::kInput, OperandRole::kGradOutput});
  EXPECT_EQ(states.dtype(0), DType::kFloat8E4M3);
  EXPECT_EQ(states.dtype(1), DType::kFloat8E5M2);
  EXPECT_EQ(states.scale().data_as<float>()[0], 1.0f);
  EXPECT_EQ(states.scale_inv().data_as<float>()[QuantizedTensor::kScalarSlot], 1.0f);
  float* amax = states.current_amax().data_as<float>();
  amax[0] = 2.0f;
  amax[1] = 4.0f;
  states.update();
  EXPECT_EQ(states.scale().data_as<float>()[0], 224.0f);
  EXPECT_EQ(states.scale().data_as<float>()[QuantizedTensor::kScalarSlot], 14336.0f);
  EXPECT_EQ(amax[0], 0.0f);  // row 0 is cleared for the next step
  ScalingStates e4m3(DelayedScaling{0.0f, 4, AmaxComputeAlgo::kMax, Fp8Format::kE4M3},
                     {OperandRole::kGradOutput});
  EXPECT_EQ(e4m3.dtype(0), DType::kFloat8E4M3);
}

TEST(DelayedUpdate, BindPointsQuantizeAtTheState) {
  ScalingStates states(DelayedScaling{}, {OperandRole::kWeight, OperandRole::kInput});
  states.scale().data_as<float>()[QuantizedTensor::kScalarSlot] = 8.0f;
  QuantizedTensor q(DType::kFloat8E4M3, Shape{2, 2}, Device::host(), false);
  QuantizedTensorView v = q.view();
  states.bind(1, v);
  std::vector<float> x = {1.0f, -3.0f, 0.5f, 2.0f};
  quantize(TensorView(x.data(), DType::kFloat32, Shape{2, 2}), v);
  EXPECT_EQ(states.current_amax().data_as<float>()[1], 3.0f);
  EXPECT_EQ(states.scale_inv().data_as<float>()[QuantizedTensor::kScalarSlot], 0.125f);
  EXPECT_EQ(states.current_amax().data_as<float>()[0], 0.0f);
}

// cuBLASLt takes FP8 scale pointers only 16-byte aligned (docs/design/gemm.md): every
// operand's scale and scale_inv must be, so that the GEMM launches without staging them.
TEST(DelayedUpdate, BindHandsOutSixteenByteAlignedScales) {
  ScalingStates states(DelayedScaling{}, std::vector<OperandRole>(7, OperandRole::kWeight));
  QuantizedTensor q(DType::kFloat8E4M3, Shape{2}, Device::host(), false);
  for (int i = 0; i < states.size(); ++i) {
    QuantizedTensorView v = q.view();
    states.bind(i, v);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.scale) % 16, 0u) << "operand " << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.scale_inv) % 16, 0u) << "operand " << i;
    EXPECT_EQ(v.amax, states.current_amax().data_as<float>() + i) << "row 0 stays packed";
    EXPECT_EQ(*v.scale, 1.0f);
    EXPECT_EQ(*v.scale_inv, 1.0f);
  }
}

// The free update takes packed scales [n] (the JAX primitive's) as well as ScalingStates'
// padded [n, k]: both give the same bits.
TEST(DelayedUpdate, PackedAndPaddedScalesUpdateAlike) {
  const std::vector<OperandRole> roles = {OperandRole::kInput, OperandRole::kGradOutput,
                                          OperandRole::kWeight};
  DelayedScaling recipe;
  recipe.amax_history_len = 3;
  ScalingStates states(recipe, roles);
  Tensor history(DType::kFloat32, Shape{3, 3}), scale(DType::kFloat32, Shape{3}),
      maxima(DType::kFloat32, Shape{3});
  std::fill_n(history.data_as<float>(), 9, 0.0f);
  for (int i = 0; i < 3; ++i) {
    scale.data_as<float>()[i] = 1.0f;
    maxima.data_as<float>()[i] = fp8_max(states.dtype(i));
  }
  for (int step = 0; step < 5; ++step) {
    for (int i = 0; i < 3; ++i)
      history.data_as<float>()[i] = states.current_amax().data_as<float>()[i] =
          float(1 + step * 3 + i) * (i == 1 && step == 2 ? 0.0f : 0.5f);
    states.update();
    update_delayed_scaling(history, scale, maxima, recipe);
    for (int i = 0; i < 3; ++i)
      ASSERT_TRUE(test::same_bits(states.scale().data_as<float>()[i * QuantizedTensor::kScalarSlot],
                                  scale.data_as<float>()[i]))
          << "step " << step << " operand " << i;
  }
  EXPECT_QMESH_ERROR(
      update_delayed_scaling(history, Tensor(DType::kFloat32, Shape{2}), maxima, recipe),
      "scale must be fp32 [3] or [3, k]");
}

// Several micro-batches before one update: the history records the max over all of them,
// and the update starts the next step's row from zero.
TEST(DelayedUpdate, MicroBatchesOfOneStepAccumulateTheirAmax) {
  DelayedScaling recipe;
  recipe.amax_history_len = 4;
  ScalingStates states(recipe, {OperandRole::kInput});
  QuantizedTensor q(DType::kFloat8E4M3, Shape{1, 2}, Device::host(), false);
  QuantizedTensorView v = q.view();
  states.bind(0, v);
  const float batches[3][2] = {{1.0f, -2.0f}, {7.0f, 0.5f}, {-3.0f, 3.0f}};
  for (const auto& b : batches)
    quantize(TensorView(const_cast<float*>(b), DType::kFloat32, Shape{1, 2}), v);
  EXPECT_EQ(states.current_amax().data_as<float>()[0], 7.0f);
  states.update();
  const float* history = states.amax_history().data_as<float>();
  EXPECT_EQ(history[0], 0.0f) << "the next step's row starts at zero";
  EXPECT_EQ(history[3], 7.0f) << "the step's amax is the max over its micro-batches";
  EXPECT_EQ(states.scale().data_as<float>()[0], 448.0f / 7.0f);
  const float next[2] = {0.25f, -0.5f};
  quantize(TensorView(const_cast<float*>(next), DType::kFloat32, Shape{1, 2}), v);
  EXPECT_EQ(states.current_amax().data_as<float>()[0], 0.5f);
}

// One test per rule of docs/numerics.md "Delayed scaling" (TransformerEngine's update
// kernel), each with values where the alternative rule gives a different answer.

// Runs `amaxes` (one update each) through a one-operand e4m3 state and returns it.
ScalingStates run_updates(const DelayedScaling& recipe, const std::vector<float>& amaxes) {
  ScalingStates states(recipe, {OperandRole::kInput});
  for (float a : amaxes) {
    states.current_amax().data_as<float>()[0] = a;
    states.update();
  }
  return states;
}

DelayedScaling recipe_of(float margin, int len, AmaxComputeAlgo algo) {
  DelayedScaling r;
  r.margin = margin;
  r.amax_history_len = len;
  r.amax_compute_algo = algo;
  r.fp8_format = Fp8Format::kE4M3;
  return r;
}

TEST(DelayedUpdateRules, NanInTheWindowIsSkippedByMax) {
  // 2, then NaN: the window {2, NaN} gives 2, not NaN (which would keep the old scale 224).
  const ScalingStates s = run_updates(recipe_of(0, 4, AmaxComputeAlgo::kMax), {2.0f, kNan, 8.0f});
  // Third step: window {2, NaN, 8} -> 8.
  EXPECT_EQ(s.scale().data_as<float>()[0], 448.0f / 8.0f);
  const ScalingStates t = run_updates(recipe_of(0, 4, AmaxComputeAlgo::kMax), {4.0f, kNan});
  EXPECT_EQ(t.scale().data_as<float>()[0], 448.0f / 4.0f)
      << "the NaN step's window {4, NaN} must give 4";
  EXPECT_TRUE(std::isnan(t.amax_history().data_as<float>()[3])) << "the NaN is still recorded";
}

TEST(DelayedUpdateRules, AllNanWindowKeepsTheScale) {
  const ScalingStates s = run_updates(recipe_of(0, 2, AmaxComputeAlgo::kMax), {kNan, kNan});
  EXPECT_EQ(s.scale().data_as<float>()[0], 1.0f);
}

TEST(DelayedUpdateRules, MostRecentNanOrInfKeepsTheScale) {
  const auto r = recipe_of(0, 4, AmaxComputeAlgo::kMostRecent);
  EXPECT_EQ(run_updates(r, {2.0f, kNan}).scale().data_as<float>()[0], 224.0f);
  EXPECT_EQ(run_updates(r, {2.0f, INFINITY}).scale().data_as<float>()[0], 224.0f);
}

TEST(DelayedUpdateRules, InfiniteAmaxInTheWindowKeepsTheScale) {
  const ScalingStates s =
      run_updates(recipe_of(0, 4, AmaxComputeAlgo::kMax), {2.0f, INFINITY, 8.0f});
  EXPECT_EQ(s.scale().data_as<float>()[0], 224.0f) << "inf stays the window's max";
}

TEST(DelayedUpdateRules, ZeroAmaxDoesNotRoll) {
  const ScalingStates s = run_updates(recipe_of(0, 3, AmaxComputeAlgo::kMax), {2.0f, 0.0f});
  const float* h = s.amax_history().data_as<float>();
  EXPECT_EQ(h[2], 2.0f) << "a zero amax (the operand did not run) leaves the history";
  EXPECT_EQ(h[1], 0.0f);
  EXPECT_EQ(s.scale().data_as<float>()[0], 224.0f);
}

TEST(DelayedUpdateRules, MarginScalesFp8MaxBeforeTheDivision) {
  // 448 / 1e-37 overflows fp32, so dividing by 2^margin afterwards would give FLT_MAX;
  // (448 * 2^-8) / 1e-37 = 1.75e37 is in range.
  const float amax = 1e-37f;
  const ScalingStates s = run_updates(recipe_of(8, 1, AmaxComputeAlgo::kMax), {amax});
  const auto want = static_cast<float>(double(448.0f / 256.0f) / double(amax));
  ASSERT_LT(want, FLT_MAX);
  EXPECT_EQ(s.scale().data_as<float>()[0], want);
  // Half-integer margins: fp8_max * 2^-0.5 rounded to fp32 first, then one division.
  const ScalingStates h = run_updates(recipe_of(0.5f, 1, AmaxComputeAlgo::kMax), {3.0f});
  const auto scaled = static_cast<float>(448.0 * std::exp2(-0.5));
  EXPECT_EQ(h.scale().data_as<float>()[0], static_cast<float>(double(scaled) / 3.0));
}

TEST(DelayedUpdateRules, TinyAmaxGivesFltMax) {
  EXPECT_EQ(
      run_updates(recipe_of(0, 1, AmaxComputeAlgo::kMax), {1e-40f}).scale().data_as<float>()[0],
      FLT_MAX);
}

TEST(DelayedUpdate, BadArgumentsAreErrors) {
  DelayedScaling bad;
  bad.amax_history_len = 0;
  EXPECT_QMESH_ERROR(ScalingStates(bad, {OperandRole::kInput}), "amax_history_len");
  bad = DelayedScaling{};
  bad.margin = -1.0f;
  EXPECT_QMESH_ERROR(ScalingStates(bad, {OperandRole::kInput}), "margin must be in [0, 64]");
  bad = DelayedScaling{};
  bad.amax_compute_algo = static_cast<AmaxComputeAlgo>(7);
  EXPECT_QMESH_ERROR(ScalingStates(bad, {OperandRole::kInput}), "amax_compute_algo");
  EXPECT_QMESH_ERROR(ScalingStates(DelayedScaling{}, {}), "at least one operand");
  bad = DelayedScaling{};
  bad.fp8_format = static_cast<Fp8Format>(9);
  EXPECT_QMESH_ERROR(ScalingStates(bad, {OperandRole::kInput}), "fp8_format");
  EXPECT_QMESH_ERROR(fp8_dtype(Fp8Format::kHybrid, static_cast<OperandRole>(5)), "operand role");
  if (cuda_device_count() == 0) {
    EXPECT_QMESH_ERROR(ScalingStates(DelayedScaling{}, {OperandRole::kInput}, Device::cuda(0)),
                       "cuda:0");
  }
  ScalingStates empty;
  EXPECT_QMESH_ERROR(empty.update(), "default-constructed");
  ScalingStates states(DelayedScaling{}, {OperandRole::kGradOutput});
  QuantizedTensor q(DType::kFloat8E4M3, Shape{2}, Device::host(), false);
  QuantizedTensorView v = q.view();
  EXPECT_QMESH_ERROR(states.bind(0, v), "quantized to fp8e5m2 by this recipe");
  EXPECT_QMESH_ERROR(states.bind(3, v), "operand index 3 out of range");
}

TEST(CurrentScaling, ScaleMatchesFloat64Rule) {
  const Float8CurrentScaling plain;
  Float8CurrentScaling pow2;
  pow2.power_of_two_scales = true;
  Float8CurrentScaling eps;
  eps.amax_epsilon = 1e-3f;
  const DType e4 = DType::kFloat8E4M3;
  EXPECT_EQ(current_scale(0.0f, e4, plain), 1.0f);
  EXPECT_EQ(current_scale(std::numeric_limits<float>::infinity(), e4, plain), 1.0f);
  EXPECT_EQ(current_scale(kNan, e4, plain), 1.0f);
  EXPECT_EQ(current_scale(1e-40f, e4, plain), FLT_MAX);
  EXPECT_EQ(current_scale(0.0f, e4, eps), static_cast<float>(448.0 / double(1e-3f)));
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> log2_value(-30.0, 30.0);
  for (int k = 0; k < 10000; ++k) {
    const auto a = static_cast<float>(std::exp2(log2_value(rng)));
    const double exact = 57344.0 / a;
    EXPECT_EQ(current_scale(a, DType::kFloat8E5M2, plain), static_cast<float>(exact));
    const float p = current_scale(a, DType::kFloat8E5M2, pow2);
    const double expected = std::exp2(std::floor(std::log2(double(static_cast<float>(exact)))));
    EXPECT_EQ(double(p), expected) << "amax " << a;
  }
}

TEST(CurrentScaling, QuantizesWithItsOwnAmax) {
  const Tensor x = test::random_wide(DType::kBFloat16, Shape{33, 65}, 9);
  QuantizedTensor q(DType::kFloat8E4M3, Shape{33, 65}, Device::host(), true);
  quantize_current_scaling(x, q.view(), Float8CurrentScaling{});
  double amax = 0;
  for (int64_t i = 0; i < x.numel(); ++i)
    amax = std::max(amax, std::fabs(double(test::wide_at(x, i))));
  const auto scale = static_cast<float>(448.0 / amax);
  EXPECT_EQ(*q.view().scale, scale);
  EXPECT_EQ(double(*q.view().amax), amax);
  const auto* codes = static_cast<const uint8_t*>(q.data().data());
  const auto* codes_t = static_cast<const uint8_t*>(q.data_t().data());
  for (int64_t r = 0; r < 33; ++r)
    for (int64_t c = 0; c < 65; ++c) {
      const uint8_t want = float_to_e4m3(test::wide_at(x, r * 65 + c) * scale);
      ASSERT_EQ(codes[r * 65 + c], want);
      ASSERT_EQ(codes_t[c * 33 + r], want);
    }
  Float8CurrentScaling bad;
  bad.amax_epsilon = -1.0f;
  EXPECT_QMESH_ERROR(quantize_current_scaling(x, q.view(), bad), "amax_epsilon");
}

}  // namespace
}  // namespace qmesh
