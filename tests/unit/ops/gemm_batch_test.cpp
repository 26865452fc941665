// The strided-batched GEMM (GemmArgs::batch) on the host: bit-identical to one 2-D GEMM per
// batch element, each within the float64 reference's tolerance; and its named errors.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "expect_error.h"
#include "gemm_test_util.h"
#include "qmesh/ops/gemm.h"

namespace qmesh::test {
namespace {

constexpr DType kE4 = DType::kFloat8E4M3, kF32 = DType::kFloat32, kBf16 = DType::kBFloat16;
constexpr int64_t kBatch = 3;

// A batch of `kBatch` matrices [rows, cols] stored one after another, with one scale for all
// of them (an FP8 batch is quantized as one tensor, as delayed scaling does).
struct Batch {
  Matrix all;  // [kBatch · rows, cols]
  int64_t rows = 0, cols = 0;

  Batch(DType t, int64_t r, int64_t c, uint32_t seed)
      : all(random_matrix(t, kBatch * r, c, seed)), rows(r), cols(c) {}
  Batch(DType t, int64_t r, int64_t c) : all(t, kBatch * r, c), rows(r), cols(c) {}

  TensorView view() { return TensorView(all.bytes.data(), all.dtype, Shape{kBatch, rows, cols}); }
  GemmOperand operand() {
    if (!is_fp8(all.dtype)) return GemmOperand::plain(view());
    QuantizedTensorView q = all.qview(false);
    q.data = view();
    return GemmOperand::fp8(q);
  }
  // Element i as a matrix of its own (a copy, with the batch's scalars).
  Matrix element(int64_t i) const {
    Matrix m(all.dtype, rows, cols);
    const size_t bytes = m.bytes.size();
    std::memcpy(m.bytes.data(), all.bytes.data() + size_t(i) * bytes, bytes);
    std::memcpy(m.scalars, all.scalars, sizeof(m.scalars));
    return m;
  }
};

struct Case {
  DType ab, d;
  GemmTranspose ta, tb;
  GemmEpilogue epilogue;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(dtype_name(c.ab)) + "_to_" + std::string(dtype_name(c.d)) + "_" +
         (c.ta == GemmTranspose::kYes ? "T" : "N") + (c.tb == GemmTranspose::kYes ? "T" : "N") +
         "_" + gemm_epilogue_name(c.epilogue);
}

class GemmBatchHost : public testing::TestWithParam<Case> {};

TEST_P(GemmBatchHost, EqualsOneGemmPerElementBitForBit) {
  const Case& c = GetParam();
  const int64_t m = 5, n = 7, k = 9;
  const bool at = c.ta == GemmTranspose::kYes, bt = c.tb == GemmTranspose::kYes;
  Batch a = at ? Batch(c.ab, k, m, 1) : Batch(c.ab, m, k, 1);
  Batch b = bt ? Batch(c.ab, n, k, 2) : Batch(c.ab, k, n, 2);
  Batch d(c.d, m, n);
  Matrix bias = random_matrix(kBf16, 1, n, 3);

  GemmArgs args;
  args.a = a.operand();
  args.b = b.operand();
  args.trans_a = c.ta;
  args.trans_b = c.tb;
  args.alpha = 0.75f;
  args.epilogue = c.epilogue;
  if (c.epilogue == GemmEpilogue::kBias) args.bias = TensorView(bias.bytes.data(), kBf16, Shape{n});
  float d_scale = 4.0f;
  if (is_fp8(c.d)) args.d_scale = &d_scale;
  args.d = d.view();
  args.batch = kBatch;
  ASSERT_TRUE(Gemm::can_implement(args)) << Gemm::can_implement(args).reason();
  gemm(args);

  for (int64_t i = 0; i < kBatch; ++i) {
    Matrix ai = a.element(i), bi = b.element(i), di(c.d, m, n);
    GemmArgs one = args;
    one.batch = 1;
    one.a = ai.operand(false);
    one.b = bi.operand(false);
    one.d = di.view();
    gemm(one);
    const Matrix batched = d.element(i);
    EXPECT_EQ(batched.bytes, di.bytes) << "element " << i;

    const Reference ref = reference_gemm(ai, c.ta, bi, c.tb, args.alpha, c.epilogue,
                                         GemmOutputMode::kWrite, {}, bias.values(), {});
    std::vector<double> out = batched.values();
    if (is_fp8(c.d))
      for (double& v : out) v /= d_scale;
    EXPECT_LE(relative_error(out, ref.d), output_tolerance(c.d)) << "element " << i;
  }
}

constexpr GemmTranspose kN = GemmTranspose::kNo, kT = GemmTranspose::kYes;

INSTANTIATE_TEST_SUITE_P(Forms, GemmBatchHost,
                         testing::Values(Case{kF32, kF32, kN, kT, GemmEpilogue::kNone},
                                         Case{kF32, kF32, kT, kN, GemmEpilogue::kGelu},
                                         Case{kBf16, kBf16, kN, kN, GemmEpilogue::kBias},
                                         Case{kBf16, kF32, kT, kT, GemmEpilogue::kNone},
                                         Case{kE4, kBf16, kN, kT, GemmEpilogue::kNone},
                                         Case{kE4, kF32, kT, kN, GemmEpilogue::kBias},
                                         Case{kE4, kE4, kT, kT, GemmEpilogue::kGelu}),
                         case_name);

// ---- errors ---------------------------------------------------------------------------------

struct Problem {
  Batch a{kE4, 4, 16, 1};
  Batch b{kE4, 8, 16, 2};
  Batch d{kBf16, 4, 8};
  GemmArgs args() {
    GemmArgs g;
    g.a = a.operand();
    g.b = b.operand();
    g.d = d.view();
    g.batch = kBatch;
    return g;
  }
};

TEST(GemmBatchErrors, BatchBelowOne) {
  Problem p;
  GemmArgs g = p.args();
  g.batch = 0;
  expect_refused(g, "GemmArgs.batch must be >= 1");
}

TEST(GemmBatchErrors, ShapesNotBatchRowsCols) {
  Problem p;
  GemmArgs g = p.args();
  g.d = TensorView(p.d.all.bytes.data(), kBf16, Shape{kBatch * 4, 8});  // 2-D
  expect_refused(g, "GemmArgs.d of a GEMM with batch = 3 must be 3-D [batch, rows, cols]");
  g = p.args();
  g.a.quantized.data = TensorView(p.a.all.bytes.data(), kE4, Shape{1, kBatch * 4, 16});
  expect_refused(g, "GemmArgs.a of a GEMM with batch = 3 must be 3-D");
}

TEST(GemmBatchErrors, EpiloguesWithPerElementTensors) {
  for (GemmEpilogue e :
       {GemmEpilogue::kBiasGeluAux, GemmEpilogue::kDGelu, GemmEpilogue::kBiasGrad}) {
    Problem p;
    GemmArgs g = p.args();
    g.epilogue = e;
    expect_refused(
        g, "takes epilogue kNone, kBias or kGelu, got " + std::string(gemm_epilogue_name(e)));
  }
}

TEST(GemmBatchErrors, AmaxOfD) {
  Problem p;
  Batch d(kE4, 4, 8);
  float scale = 1.0f, amax = 0.0f;
  GemmArgs g = p.args();
  g.d = d.view();
  g.d_scale = &scale;
  g.d_amax = &amax;
  expect_refused(g, "does not compute the amax of D");
}

TEST(GemmBatchErrors, BlockScaledOperands) {
  Problem p;
  GemmArgs g = p.args();
  std::vector<float> scales(64, 1.0f);
  BlockQuantizedTensorView q;
  q.data = p.a.view();
  q.scale_inv = TensorView(scales.data(), kF32, Shape{64});
  g.a = GemmOperand::fp8_block(q);
  expect_refused(g, "takes per-tensor FP8 or plain operands only, but GemmArgs.a is block-scaled");
}

// On CUDA an FP8 operand not stored contiguous along K would need a per-element columnwise
// copy; checked before the device's availability, on views naming cuda:0 (never read).
TEST(GemmBatchErrors, CudaFp8OperandNotContiguousAlongK) {
  alignas(64) static uint8_t memory[4096];
  static float scalars[3] = {1, 1, 0};
  const auto fp8 = [](Shape shape) {
    QuantizedTensorView q;
    q.data = TensorView(memory, kE4, std::move(shape), Device::cuda(0));
    q.scale = &scalars[0];
    q.scale_inv = &scalars[1];
    q.amax = &scalars[2];
    return GemmOperand::fp8(q);
  };
  GemmArgs g;
  g.a = fp8(Shape{kBatch, 16, 16});
  g.b = fp8(Shape{kBatch, 16, 16});
  g.trans_b = GemmTranspose::kNo;
  g.d = TensorView(memory, kBf16, Shape{kBatch, 16, 16}, Device::cuda(0));
  g.batch = kBatch;
  const Status s = Gemm::can_implement(g);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.reason().find("a GEMM with batch = 3 has none per element"), std::string::npos)
      << s.reason();
}

}  // namespace
}  // namespace qmesh::test
