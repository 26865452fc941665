// The training-step sequence and the layers' FP8 state on one rank (docs/design/layers.md
// "The step sequence"): a forward after a layer's backward without LayerContext::end_step()
// is an error naming the missing call under delayed scaling; a layer not run in a step keeps
// its scaling state through end_step(); a layer run twice in a step records the larger amax
// of its two inputs (the running max over the step), checked against max|x| computed here.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <string>

#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/error.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/scaling/checkpoint.h"

namespace qmesh {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kTokens = 4, kIn = 16, kOut = 16;

// x[i] = scale * (a value in [-1, 1] whose largest magnitude is 1).
Tensor input(float scale) {
  Tensor x(DType::kFloat32, Shape{kTokens, kIn});
  for (int64_t i = 0; i < x.numel(); ++i)
    x.data_as<float>()[i] = scale * (float((i * 7) % 9) / 4.0f - 1.0f);
  return x;
}

double max_abs(const Tensor& t) {
  double m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(double(t.data_as<float>()[i])));
  return m;
}

struct OneRank {
  explicit OneRank(Recipe recipe)
      : mesh(make_local_world(1)[0], {{"dp", 1}}), ctx(mesh, recipe), dy(input(0.01f)) {}
  Mesh mesh;
  LayerContext ctx;
  Tensor dy;
};

// The scaling state's tensors by name (host copies).
std::map<std::string, Tensor> state(LayerContext& ctx) { return scaling_tensors(ctx.scaling()); }

TEST(StepSequence, AForwardAfterBackwardWithoutEndStepIsAnErrorUnderDelayedScaling) {
  OneRank r(Recipe::kFp8Delayed);
  LayerNormMLP block("block0", kIn, 32, {}, r.ctx, 1);
  const Tensor x = input(1.0f);
  block.forward(x);
  block.backward(r.dy);
  try {
    block.forward(x);
    FAIL() << "a skipped end_step() went unnoticed";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(),
                HasSubstr("layer 'block0.fc1': forward after its backward in step 0 "
                          "without LayerContext::end_step() (qmesh_context_end_step) in between"));
    EXPECT_THAT(e.message(), HasSubstr("FP8 scales stay frozen"));
  }
  r.ctx.end_step();
  EXPECT_EQ(r.ctx.steps(), 1);
  block.forward(x);  // the sequence is right again
  block.backward(r.dy);
  r.ctx.end_step();
}

TEST(StepSequence, OtherRecipesHaveNothingForEndStepToDoAndAreNotChecked) {
  for (Recipe recipe : {Recipe::kFp32, Recipe::kBf16, Recipe::kFp8Current}) {
    OneRank r(recipe);
    Dense dense("d", kIn, kOut, {}, r.ctx, 1);
    const Tensor x = input(1.0f);
    for (int i = 0; i < 2; ++i) {
      dense.forward(x);
      EXPECT_NO_THROW(dense.backward(r.dy)) << recipe_name(recipe);
    }
  }
}

TEST(StepSequence, ALayerNotRunInAStepKeepsItsScalingState) {
  OneRank r(Recipe::kFp8Delayed);
  Dense a("a", kIn, kOut, {}, r.ctx, 1), b("b", kIn, kOut, {}, r.ctx, 2);
  const Tensor x = input(1.0f);
  for (Dense* d : {&a, &b}) {
    d->forward(x);
    d->backward(r.dy);
  }
  r.ctx.end_step();
  const auto before = state(r.ctx);
  a.forward(input(3.0f));  // b is not run in this step
  a.backward(r.dy);
  r.ctx.end_step();
  const auto after = state(r.ctx);
  // Operands 0-2 are a's (x, w, dy), 3-5 b's: b's history columns and scales are unchanged.
  const int64_t n = 6, len = after.at("scaling.amax_history").shape().rows();
  const float* h0 = before.at("scaling.amax_history").data_as<float>();
  const float* h1 = after.at("scaling.amax_history").data_as<float>();
  for (int64_t row = 0; row < len; ++row)
    for (int64_t op = 3; op < n; ++op) EXPECT_EQ(h1[row * n + op], h0[row * n + op]) << op;
  for (const char* name : {"scaling.scale", "scaling.scale_inv"})
    for (int64_t op = 3; op < n; ++op)
      EXPECT_EQ(after.at(name).data_as<float>()[op], before.at(name).data_as<float>()[op]) << name;
  // a's input operand recorded this step's amax (3x the first): its scale changed.
  EXPECT_NE(after.at("scaling.scale").data_as<float>()[0],
            before.at("scaling.scale").data_as<float>()[0]);
}

TEST(StepSequence, ALayerRunTwiceInAStepRecordsTheLargerAmax) {
  for (bool large_first : {false, true}) {
    OneRank r(Recipe::kFp8Delayed);
    Dense d("d", kIn, kOut, {}, r.ctx, 1);
    const Tensor small = input(0.5f), large = input(6.0f);
    d.forward(large_first ? large : small);
    d.forward(large_first ? small : large);  // a second call in the same step
    d.backward(r.dy);
    r.ctx.end_step();
    const auto s = state(r.ctx);
    const float* history = s.at("scaling.amax_history").data_as<float>();
    const int64_t n = 3, len = s.at("scaling.amax_history").shape().rows();
    // The roll moved this step's amax out of row 0 (zeroed for the next step): find it.
    double recorded = 0;
    for (int64_t row = 0; row < len; ++row)
      recorded = std::max(recorded, double(history[row * n + 0]));
    EXPECT_EQ(recorded, std::max(max_abs(small), max_abs(large))) << large_first;
  }
}

}  // namespace
}  // namespace qmesh
