// The emulated MXFP8 GEMM (qmesh/ops/gemm_emulation.h) on the host: in the three layer forms
// (fprop TN, dgrad through B's columnwise copy, wgrad through both columnwise copies) it gives
// the bits of the plain fp32 GEMM of the dequantized copies, and it is close to a float64
// GEMM of code * 2^(scale - 127) computed here. Without the request to emulate it is an Error
// that says how to ask; every emulated GEMM is counted.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "expect_error.h"
#include "gemm_layer_forms.h"
#include "qmesh/fp8.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/ops/gemm_emulation.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

using enum GemmTranspose;

MxFp8Tensor quantized(DType fp8, int64_t rows, int64_t cols, uint32_t seed) {
  const Tensor x = test::random_wide(DType::kFloat32, Shape{rows, cols}, seed);
  MxFp8Tensor q(fp8, Shape{rows, cols}, Device::host(), true);
  mxfp8_quantize(x.view(), q.view());
  return q;
}

// The float64 values of the rowwise copy of q: code * 2^(scale - 127).
std::vector<double> values(const MxFp8TensorView& q) {
  const auto* codes = static_cast<const uint8_t*>(q.data.data);
  const auto* scale = static_cast<const uint8_t*>(q.scale.data);
  std::vector<double> v(size_t(q.data.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] =
        double(test::decode_ref(q.dtype(), codes[i])) * std::ldexp(1.0, int(scale[i / 32]) - 127);
  return v;
}

// The copy of q whose rows run along K.
MxFp8TensorView k_rows(const MxFp8Tensor& q, bool rowwise) {
  const MxFp8TensorView v = q.view();
  MxFp8TensorView c;
  c.data = rowwise ? v.data : v.data_t;
  c.scale = rowwise ? v.scale : v.scale_t;
  return c;
}

TEST(GemmMxfp8, EmulatedIsThePlainGemmOfTheDequantizedOperands) {
  const int64_t m = 64, n = 96, k = 128;
  for (const test::GemmLayerForm& f : test::gemm_layer_forms(m, n, k)) {
    SCOPED_TRACE(f.name);
    const MxFp8Tensor a = quantized(DType::kFloat8E5M2, f.a_rows, f.a_cols, 1);
    const MxFp8Tensor b = quantized(DType::kFloat8E4M3, f.b_rows, f.b_cols, 2);
    Tensor bias(DType::kFloat32, Shape{n});
    for (int64_t i = 0; i < n; ++i) static_cast<float*>(bias.data())[i] = 0.125f * float(i % 5);
    Tensor d(DType::kFloat32, Shape{m, n});
    GemmArgs args = test::layer_gemm_args(f, GemmOperand::mxfp8(a.view()),
                                          GemmOperand::mxfp8(b.view()), d.view());
    args.epilogue = GemmEpilogue::kBias;
    args.bias = bias.view();
    args.emulate_microscaled = true;
    const int64_t before = emulated_gemm_count();
    gemm(args);
    EXPECT_EQ(emulated_gemm_count(), before + 1);

    // The same GEMM on the dequantized K-contiguous copies, plain fp32: the same bits.
    const MxFp8TensorView ak = k_rows(a, f.ta == kNo), bk = k_rows(b, f.tb == kYes);
    Tensor a32(DType::kFloat32, Shape{m, k}), b32(DType::kFloat32, Shape{n, k});
    mxfp8_dequantize(ak, a32.view());
    mxfp8_dequantize(bk, b32.view());
    GemmArgs plain = args;
    plain.a = GemmOperand::plain(a32.view());
    plain.b = GemmOperand::plain(b32.view());
    plain.trans_a = kNo;
    plain.trans_b = kYes;
    Tensor d32(DType::kFloat32, Shape{m, n});
    plain.d = d32.view();
    gemm(plain);
    EXPECT_EQ(std::memcmp(d.data(), d32.data(), d.nbytes()), 0);

    // Close to float64.
    const std::vector<double> av = values(ak), bv = values(bk);
    double err = 0.0, norm = 0.0;
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0.125 * double(j % 5);
        for (int64_t p = 0; p < k; ++p) ref += av[i * k + p] * bv[j * k + p];
        const double got = static_cast<const float*>(d.data())[i * n + j];
        err += (got - ref) * (got - ref);
        norm += ref * ref;
      }
    EXPECT_LE(std::sqrt(err / norm), 1e-5);
  }
}

TEST(GemmMxfp8, WithoutEmulationItIsAnErrorThatSaysHowToAsk) {
  const MxFp8Tensor a = quantized(DType::kFloat8E4M3, 32, 64, 3);
  const MxFp8Tensor b = quantized(DType::kFloat8E4M3, 32, 64, 4);
  Tensor d(DType::kFloat32, Shape{32, 32});
  GemmArgs args;
  args.a = GemmOperand::mxfp8(a.view());
  args.b = GemmOperand::mxfp8(b.view());
  args.d = d.view();
  ASSERT_EQ(std::getenv("QMESH_BLOCK_EMULATION"), nullptr);
  EXPECT_QMESH_ERROR(gemm(args), "the host backend has no native MXFP8 GEMM");
  EXPECT_QMESH_ERROR(gemm(args), "QMESH_BLOCK_EMULATION=1");
  EXPECT_FALSE(Gemm::can_implement(args).ok());
  setenv("QMESH_BLOCK_EMULATION", "1", 1);
  const int64_t before = emulated_gemm_count();
  EXPECT_TRUE(Gemm::can_implement(args).ok());
  gemm(args);
  gemm_planned(args, nullptr, {});
  EXPECT_EQ(emulated_gemm_count(), before + 2);
  setenv("QMESH_BLOCK_EMULATION", "2", 1);
  EXPECT_QMESH_ERROR(gemm(args), "QMESH_BLOCK_EMULATION must be 0 or 1");
  unsetenv("QMESH_BLOCK_EMULATION");
}

TEST(GemmMxfp8, RefusesWhatCannotRun) {
  const MxFp8Tensor a = quantized(DType::kFloat8E4M3, 32, 64, 5);
  MxFp8Tensor rowwise_only(DType::kFloat8E4M3, Shape{32, 64}, Device::host(), false);
  Tensor d(DType::kFloat32, Shape{32, 32});
  GemmArgs args;
  args.a = GemmOperand::mxfp8(a.view());
  args.b = GemmOperand::mxfp8(rowwise_only.view());
  args.trans_b = kNo;  // B [K=32, N=64] would need B's columnwise copy
  args.d = d.view();
  args.emulate_microscaled = true;
  EXPECT_QMESH_ERROR(gemm(args), "quantize it with a columnwise copy");
  const Tensor plain(DType::kFloat32, Shape{32, 64});
  args.b = GemmOperand::plain(plain.view());
  args.trans_b = kYes;
  EXPECT_QMESH_ERROR(gemm(args), "pair only with MXFP8 operands");
  args.b = GemmOperand::mxfp8(a.view());
  Tensor d8(DType::kFloat8E4M3, Shape{32, 32});
  args.d = d8.view();
  EXPECT_QMESH_ERROR(gemm(args), "cannot write an FP8 D");
}

}  // namespace
}  // namespace qmesh
