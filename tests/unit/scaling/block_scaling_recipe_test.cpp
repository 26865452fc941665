// Float8BlockScaling: TransformerEngine's defaults, and validate() naming the field it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "expect_error.h"
#include "qmesh/scaling/recipe.h"

namespace qmesh {
namespace {

TEST(BlockScalingRecipe, DefaultsAreTransformerEngines) {
  const Float8BlockScaling r;
  EXPECT_EQ(r.fp8_format, Fp8Format::kE4M3);
  for (const QParams& q : {r.fp8_quant_fwd_inp, r.fp8_quant_fwd_weight, r.fp8_quant_bwd_grad}) {
    EXPECT_TRUE(q.power_2_scale);
    EXPECT_EQ(q.amax_epsilon, 0.0f);
  }
  EXPECT_EQ(r.x_block_scaling_dim, 1);
  EXPECT_EQ(r.w_block_scaling_dim, 2);
  EXPECT_EQ(r.grad_block_scaling_dim, 1);
  EXPECT_TRUE(r.fp8_gemm_fprop.use_split_accumulator);
  EXPECT_TRUE(r.fp8_gemm_dgrad.use_split_accumulator);
  EXPECT_TRUE(r.fp8_gemm_wgrad.use_split_accumulator);
  EXPECT_FALSE(r.fp8_dpa);
  EXPECT_FALSE(r.fp8_mha);
  EXPECT_NO_THROW(validate(r));
  Float8BlockScaling hybrid;
  hybrid.fp8_format = Fp8Format::kHybrid;
  hybrid.fp8_quant_bwd_grad = QParams{false, 1e-12f};
  EXPECT_NO_THROW(validate(hybrid));
}

TEST(BlockScalingRecipe, ValidateNamesTheRefusedField) {
  auto refused = [](auto change, const char* field) {
    Float8BlockScaling r;
    change(r);
    EXPECT_QMESH_ERROR(validate(r), field);
  };
  refused([](Float8BlockScaling& r) { r.fp8_dpa = true; }, "fp8_dpa");
  refused([](Float8BlockScaling& r) { r.fp8_mha = true; }, "fp8_mha");
  refused([](Float8BlockScaling& r) { r.x_block_scaling_dim = 3; }, "x_block_scaling_dim");
  refused([](Float8BlockScaling& r) { r.w_block_scaling_dim = 0; }, "w_block_scaling_dim");
  refused([](Float8BlockScaling& r) { r.grad_block_scaling_dim = -1; }, "grad_block_scaling_dim");
  refused([](Float8BlockScaling& r) { r.x_block_scaling_dim = 2; }, "at most one");
  refused([](Float8BlockScaling& r) { r.grad_block_scaling_dim = 2; }, "at most one");
  refused([](Float8BlockScaling& r) { r.fp8_format = static_cast<Fp8Format>(7); }, "fp8_format");
  refused([](Float8BlockScaling& r) { r.fp8_quant_fwd_inp.amax_epsilon = -1.0f; },
          "fp8_quant_fwd_inp.amax_epsilon");
  refused(
      [](Float8BlockScaling& r) {
        r.fp8_quant_fwd_weight.amax_epsilon = std::numeric_limits<float>::quiet_NaN();
      },
      "fp8_quant_fwd_weight.amax_epsilon");
  refused(
      [](Float8BlockScaling& r) {
        r.fp8_quant_bwd_grad.amax_epsilon = std::numeric_limits<float>::infinity();
      },
      "fp8_quant_bwd_grad.amax_epsilon");
  refused([](Float8BlockScaling& r) { r.fp8_gemm_wgrad.use_split_accumulator = false; },
          "fp8_gemm_wgrad.use_split_accumulator");
  // One 2D operand besides 1D ones is fine (the default has the weights 2D; gradients 2D
  // with 1D weights likewise).
  Float8BlockScaling grad2d;
  grad2d.w_block_scaling_dim = 1;
  grad2d.grad_block_scaling_dim = 2;
  EXPECT_NO_THROW(validate(grad2d));
}

}  // namespace
}  // namespace qmesh
