// The dense layer's forward epilogue: the choice among fused, bias-fused and separate passes
// under a backend's rules (cuBLASLt's: a bias with FP8 inputs is fused only in bf16), the
// bias dtype the layer asks for, and what a Dense reports after its forward.
#include "layers/forward_epilogue.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "qmesh/comm/local.h"
#include "qmesh/layers/dense.h"
#include "qmesh/random.h"

namespace qmesh::detail {
namespace {

// Storage for one forward GEMM: FP8 or bf16 operands, fp32 D and pre-activation.
struct ForwardGemm {
  QuantizedTensor x8{DType::kFloat8E4M3, Shape{4, 16}, Device::host(), false};
  QuantizedTensor w8{DType::kFloat8E4M3, Shape{8, 16}, Device::host(), false};
  Tensor x16{DType::kBFloat16, Shape{4, 16}}, w16{DType::kBFloat16, Shape{8, 16}};
  Tensor d{DType::kFloat32, Shape{4, 8}}, aux{DType::kFloat32, Shape{4, 8}};
  Tensor bias32{DType::kFloat32, Shape{8}}, bias16{DType::kBFloat16, Shape{8}};

  GemmArgs args(bool fp8, bool gelu) const {
    GemmArgs a;
    a.a = fp8 ? GemmOperand::fp8(x8.view()) : GemmOperand::plain(x16);
    a.b = fp8 ? GemmOperand::fp8(w8.view()) : GemmOperand::plain(w16);
    a.d = d;
    a.bias = forward_bias_dtype(fp8, DType::kFloat32) == DType::kBFloat16 ? TensorView(bias16)
                                                                          : TensorView(bias32);
    a.epilogue = gelu ? GemmEpilogue::kBiasGeluAux : GemmEpilogue::kBias;
    if (gelu) a.aux = aux;
    return a;
  }
};

// cuBLASLt's rule for a bias with FP8 inputs and a 32-bit D: bf16 only.
bool fp8_bias_rule(const GemmArgs& a) {
  return !a.a.is_quantized() || a.bias.empty() || a.bias.dtype == DType::kBFloat16;
}

TEST(ForwardEpilogue, FP8OperandsAskForABf16Bias) {
  EXPECT_EQ(forward_bias_dtype(true, DType::kFloat32), DType::kBFloat16);
  EXPECT_EQ(forward_bias_dtype(true, DType::kBFloat16), DType::kBFloat16);
  EXPECT_EQ(forward_bias_dtype(false, DType::kFloat32), DType::kFloat32);
  EXPECT_EQ(forward_bias_dtype(false, DType::kBFloat16), DType::kBFloat16);
  const ForwardGemm g;
  // Under cuBLASLt's bias rule the bias the layer asks for is fused, with and without GELU.
  EXPECT_EQ(choose_forward_epilogue(g.args(true, false), fp8_bias_rule), DenseEpilogue::kFused);
  EXPECT_EQ(choose_forward_epilogue(g.args(true, true), fp8_bias_rule), DenseEpilogue::kFused);
  // An fp32 bias with FP8 operands (what the layer passed before) would never be fused.
  GemmArgs fp32_bias = g.args(true, false);
  fp32_bias.bias = g.bias32;
  EXPECT_EQ(choose_forward_epilogue(fp32_bias, fp8_bias_rule), DenseEpilogue::kSeparate);
}

TEST(ForwardEpilogue, FallsBackToTheBiasAloneThenToSeparatePasses) {
  const ForwardGemm g;
  auto no_gelu = [](const GemmArgs& a) { return a.epilogue != GemmEpilogue::kBiasGeluAux; };
  std::vector<GemmArgs> asked;
  auto recording = [&](const GemmArgs& a) {
    asked.push_back(a);
    return no_gelu(a);
  };
  EXPECT_EQ(choose_forward_epilogue(g.args(true, true), recording), DenseEpilogue::kBiasFused);
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1].epilogue, GemmEpilogue::kBias);
  EXPECT_EQ(asked[1].d.data, g.aux.data()) << "the bias-only GEMM writes the pre-activation";
  EXPECT_TRUE(asked[1].aux.empty());
  auto nothing = [](const GemmArgs&) { return false; };
  EXPECT_EQ(choose_forward_epilogue(g.args(true, true), nothing), DenseEpilogue::kSeparate);
  EXPECT_EQ(choose_forward_epilogue(g.args(false, false), nothing), DenseEpilogue::kSeparate);
  GemmArgs plain = g.args(false, false);
  plain.epilogue = GemmEpilogue::kNone;
  plain.bias = {};
  EXPECT_EQ(choose_forward_epilogue(plain, nothing), DenseEpilogue::kNone);
}

// On the host every epilogue is offered: a Dense reports kFused, for every recipe; a
// row-parallel layer adds its bias after the reduction (kSeparate); no bias is kNone.
TEST(ForwardEpilogue, DenseReportsTheEpilogueItRan) {
  run_local_ranks(2, [](Communicator& comm) {
    Mesh mesh(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), {{"dp", 1}, {"tp", 2}});
    for (Recipe recipe : {Recipe::kFp32, Recipe::kBf16, Recipe::kFp8Delayed, Recipe::kFp8Current}) {
      LayerContext ctx(mesh, recipe);
      DenseOptions column;
      column.parallelism = DenseParallelism::kColumn;
      column.activation = DenseActivation::kGelu;
      DenseOptions row;
      row.parallelism = DenseParallelism::kRow;
      DenseOptions plain;
      plain.bias = false;
      Dense c("c", 16, 32, column, ctx, 1), r("r", 16, 32, row, ctx, 2),
          p("p", 16, 32, plain, ctx, 3);
      EXPECT_EQ(c.forward_epilogue(), DenseEpilogue::kNone) << "before the first forward";
      for (Dense* d : {&c, &r})  // biases start at 0: make them count
        for (Parameter* param : d->parameters())
          if (param->value.shape().rank() == 1)
            for (int64_t i = 0; i < param->value.numel(); ++i)
              param->value.data_as<float>()[i] = 0.5f;
      Tensor x(DType::kFloat32, Shape{4, 16}), x_half(DType::kFloat32, Shape{4, 8});
      for (int64_t i = 0; i < x.numel(); ++i)
        x.data_as<float>()[i] = counter_normal(5, uint64_t(i));
      for (int64_t i = 0; i < x_half.numel(); ++i)
        x_half.data_as<float>()[i] = counter_normal(6, uint64_t(i));
      c.forward(x);
      const std::vector<float> first_row_output = [&] {
        const TensorView y = r.forward(x_half);
        return std::vector<float>(y.data_as<float>(), y.data_as<float>() + y.numel());
      }();
      p.forward(x);
      // A second forward on the same input gives the same output (the bias is added once).
      const TensorView again = r.forward(x_half);
      EXPECT_EQ(std::memcmp(again.data, first_row_output.data(), again.nbytes()), 0)
          << recipe_name(recipe);
      EXPECT_EQ(c.forward_epilogue(), DenseEpilogue::kFused) << recipe_name(recipe);
      EXPECT_EQ(r.forward_epilogue(), DenseEpilogue::kSeparate) << recipe_name(recipe);
      EXPECT_EQ(p.forward_epilogue(), DenseEpilogue::kNone) << recipe_name(recipe);
    }
  });
  EXPECT_STREQ(dense_epilogue_name(DenseEpilogue::kBiasFused), "bias_fused");
}

}  // namespace
}  // namespace qmesh::detail
