// The emulated NVFP4 GEMM (qmesh/ops/gemm_emulation.h) on the host: in the three layer forms it
// gives the bits of the plain fp32 GEMM of the dequantized copies; in the wgrad form with both
// columnwise copies under the random Hadamard transform (same signs) the transform cancels:
// the result is close to the float64 product of the untransformed inputs, and far from it
// when the signs differ. Without the request to emulate it is an Error that says how to ask.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <vector>

#include "emulated_gemm_test_util.h"
#include "expect_error.h"
#include "gemm_layer_forms.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/ops/gemm_emulation.h"
#include "qmesh/ops/nvfp4_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

using enum GemmTranspose;

NvFp4Tensor quantized(const Tensor& x, const NvFp4Options& options) {
  NvFp4Tensor q(x.shape(), Device::host(), true);
  nvfp4_quantize(x.view(), q.view(), options);
  return q;
}

// The copy of q whose rows run along K, as a rowwise NVFP4 view.
NvFp4TensorView k_rows(const NvFp4Tensor& q, bool rowwise) {
  const NvFp4TensorView v = q.view();
  NvFp4TensorView c;
  c.data = rowwise ? v.data : v.data_t;
  c.scale = rowwise ? v.scale : v.scale_t;
  c.scale_inv = rowwise ? v.scale_inv : v.scale_inv_t;
  return c;
}

TEST(GemmNvfp4, EmulatedIsThePlainGemmOfTheDequantizedOperands) {
  const int64_t m = 32, n = 48, k = 64;
  NvFp4Options weight;
  weight.tiles_2d = true;
  NvFp4Options gradient;
  gradient.stochastic_rounding = true;
  gradient.seed = 11;
  for (const test::GemmLayerForm& f : test::gemm_layer_forms(m, n, k)) {
    SCOPED_TRACE(f.name);
    const NvFp4Tensor a =
        quantized(test::random_wide(DType::kFloat32, Shape{f.a_rows, f.a_cols}, 1), gradient);
    const NvFp4Tensor b =
        quantized(test::random_wide(DType::kFloat32, Shape{f.b_rows, f.b_cols}, 2), weight);
    GemmArgs args;
    args.a = GemmOperand::nvfp4(a.view());
    args.b = GemmOperand::nvfp4(b.view());
    args.trans_a = f.ta;
    args.trans_b = f.tb;
    Tensor d(DType::kFloat32, Shape{m, n});
    args.d = d.view();
    args.emulate_microscaled = true;
    const int64_t before = emulated_gemm_count();
    gemm(args);
    EXPECT_EQ(emulated_gemm_count(), before + 1);

    Tensor a32(DType::kFloat32, Shape{m, k}), b32(DType::kFloat32, Shape{n, k});
    nvfp4_dequantize(k_rows(a, f.ta == kNo), a32.view());
    nvfp4_dequantize(k_rows(b, f.tb == kYes), b32.view());
    test::expect_plain_gemm_bits(args, d, a32, b32);
  }
}

// dW = dyᵀ · x over T = 256 tokens, both operands quantized with their columnwise copies under
// the RHT along the tokens: (H D dy)ᵀ (H D x) = dyᵀ x. Relative error against the float64 dyᵀ x
// of the fp32 inputs (measured 0.10 with and 0.10 without the transform); with different
// signs for the two operands the product is not dyᵀ x (measured 1.4).
TEST(GemmNvfp4, TheHadamardTransformCancelsInTheWgradGemm) {
  const int64_t T = 256, out = 32, in = 48;
  const Tensor dy = test::random_wide(DType::kFloat32, Shape{T, out}, 3);
  const Tensor x = test::random_wide(DType::kFloat32, Shape{T, in}, 4);
  std::vector<double> want(size_t(out * in), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i)
        want[size_t(o * in + i)] +=
            double(dy.data_as<float>()[t * out + o]) * x.data_as<float>()[t * in + i];
  const auto error = [&](bool rht, uint16_t dy_signs, uint16_t x_signs) {
    NvFp4Options g, a;
    g.stochastic_rounding = true;
    g.seed = 5;
    g.rht = a.rht = rht;
    g.rht_signs = dy_signs;
    a.rht_signs = x_signs;
    const NvFp4Tensor qdy = quantized(dy, g), qx = quantized(x, a);
    GemmArgs args;
    args.a = GemmOperand::nvfp4(qdy.view());
    args.trans_a = kYes;
    args.b = GemmOperand::nvfp4(qx.view());
    args.trans_b = kNo;
    Tensor d(DType::kFloat32, Shape{out, in});
    args.d = d.view();
    args.emulate_microscaled = true;
    gemm(args);
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      const double e = double(d.data_as<float>()[i]) - want[i];
      num += e * e;
      den += want[i] * want[i];
    }
    return std::sqrt(num / den);
  };
  const uint16_t signs = nvfp4_rht_signs(9);
  const double with_rht = error(true, signs, signs), without = error(false, 0, 0);
  EXPECT_LT(with_rht, 0.2);
  EXPECT_LT(without, 0.2);
  EXPECT_GT(error(true, signs, uint16_t(~signs)), 0.5);
}

TEST(GemmNvfp4, WithoutEmulationItIsAnErrorThatSaysHowToAsk) {
  const NvFp4Tensor a = quantized(test::random_wide(DType::kFloat32, Shape{32, 64}, 5), {});
  const NvFp4Tensor b = quantized(test::random_wide(DType::kFloat32, Shape{16, 64}, 6), {});
  Tensor d(DType::kFloat32, Shape{32, 16});
  GemmArgs args;
  args.a = GemmOperand::nvfp4(a.view());
  args.b = GemmOperand::nvfp4(b.view());
  args.d = d.view();
  ASSERT_EQ(std::getenv("QMESH_BLOCK_EMULATION"), nullptr);
  EXPECT_QMESH_ERROR(gemm(args), "the host backend has no native NVFP4 GEMM");
  EXPECT_QMESH_ERROR(gemm(args), "NVFP4BlockScaling(emulate=True)");
  EXPECT_FALSE(Gemm::can_implement(args).ok());
  setenv("QMESH_BLOCK_EMULATION", "1", 1);
  EXPECT_TRUE(Gemm::can_implement(args).ok());
  gemm(args);
  unsetenv("QMESH_BLOCK_EMULATION");
  const Tensor plain(DType::kFloat32, Shape{16, 64});
  args.b = GemmOperand::plain(plain.view());
  args.emulate_microscaled = true;
  EXPECT_QMESH_ERROR(gemm(args), "NVFP4 GEMM operands pair only with NVFP4 operands");
}

}  // namespace
}  // namespace qmesh
