// Bad GEMM arguments give clear errors, from can_implement (a reason) and from gemm() (a
// qmesh::Error). The CUDA rules (TN-only FP8 through the columnwise copy, leading dimensions
// multiple of 16) are checked before the device's availability, so they are tested here on
// views that name cuda:0 but are never dereferenced.
#include <gtest/gtest.h>

#include <string>

#include "expect_error.h"
#include "gemm_test_util.h"
#include "qmesh/device.h"
#include "qmesh/ops/gemm.h"

namespace qmesh::test {
namespace {

constexpr DType kE4 = DType::kFloat8E4M3, kE5 = DType::kFloat8E5M2, kF32 = DType::kFloat32,
                kBf16 = DType::kBFloat16;

struct HostProblem {
  Matrix a = random_matrix(kE4, 8, 32, 1);
  Matrix b = random_matrix(kE4, 16, 32, 2);
  Matrix d{kBf16, 8, 16};
  GemmArgs args() { return tn_args(a, b, d); }
};

TEST(GemmErrors, ValidHostProblemIsAccepted) {
  HostProblem p;
  EXPECT_TRUE(Gemm::can_implement(p.args()));
}

// B replaced by a matrix that does not fit: wrong K, or plain where A is FP8.
TEST(GemmErrors, MismatchedB) {
  struct BadB {
    DType dtype;
    int64_t k;
    const char* error;
  };
  for (const BadB& bad : {BadB{kE4, 24, "inner dimensions differ"},
                          BadB{kBf16, 32, "both be FP8 quantized tensors or both plain"}}) {
    HostProblem p;
    Matrix b = random_matrix(bad.dtype, 16, bad.k, 3);
    GemmArgs g = p.args();
    g.b = b.operand();
    expect_refused(g, bad.error);
  }
}

TEST(GemmErrors, WrongOutputShape) {
  HostProblem p;
  Matrix d(kBf16, 16, 8);
  GemmArgs g = p.args();
  g.d = d.view();
  expect_refused(g, "GemmArgs.d must be [8, 16]");
}

TEST(GemmErrors, UnsupportedDtypeCombinations) {
  struct Combination {
    DType a, b;
    const char* error;
  };
  for (const Combination& c : {Combination{kF32, kBf16, "must have the same dtype"},
                               Combination{kE5, kE5, "fp8e5m2 × fp8e5m2 are not supported"}}) {
    Matrix a = random_matrix(c.a, 8, 32, 1), b = random_matrix(c.b, 16, 32, 2);
    Matrix d(kF32, 8, 16);
    expect_refused(tn_args(a, b, d), c.error);
  }
}

TEST(GemmErrors, RawFp8CodesAsPlainOperand) {
  HostProblem p;
  GemmArgs g = p.args();
  g.b = GemmOperand::plain(p.b.view());  // FP8 codes without their scales
  expect_refused(g, "both be FP8 quantized tensors or both plain");
}

TEST(GemmErrors, OperandWithNeitherOrBothViews) {
  HostProblem p;
  GemmArgs g = p.args();
  g.a = GemmOperand{};
  expect_refused(g, "holds neither");
  g.a = p.a.operand();
  g.a.tensor = p.a.view();
  expect_refused(g, "holds both");
}

TEST(GemmErrors, QuantizedOperandWithoutScalars) {
  HostProblem p;
  GemmArgs g = p.args();
  g.a.quantized.scale_inv = nullptr;
  expect_refused(g, "missing its scale");
}

TEST(GemmErrors, Fp8OutputNeedsFp8InputsAndScale) {
  Matrix a = random_matrix(kBf16, 8, 32, 1), b = random_matrix(kBf16, 16, 32, 2);
  Matrix d(kE4, 8, 16);
  float scale = 1.0f;
  GemmArgs g = tn_args(a, b, d);
  g.d_scale = &scale;
  expect_refused(g, "needs FP8 inputs");

  HostProblem p;
  GemmArgs h = p.args();
  h.d = d.view();
  expect_refused(h, "d_scale must point");
  h.d_scale = &scale;
  h.output = GemmOutputMode::kAccumulate;
  expect_refused(h, "kAccumulate is not available with an FP8 output");
}

TEST(GemmErrors, ScaleOrAmaxWithNonFp8Output) {
  HostProblem p;
  float amax = 0;
  GemmArgs g = p.args();
  g.d_amax = &amax;
  expect_refused(g, "for an FP8 D only");
}

TEST(GemmErrors, EpilogueTensors) {
  HostProblem p;
  Matrix bias(kBf16, 1, 16), short_bias(kBf16, 1, 15), aux(kBf16, 8, 16), bad_aux(kBf16, 16, 8);
  Matrix int_bias(DType::kInt32, 1, 16);
  GemmArgs g = p.args();
  g.epilogue = GemmEpilogue::kBias;
  expect_refused(g, "bias must be set for epilogue kBias");
  g.bias = TensorView(short_bias.bytes.data(), kBf16, Shape{15});
  expect_refused(g, "must have 16 elements");
  g.bias = TensorView(int_bias.bytes.data(), DType::kInt32, Shape{16});
  expect_refused(g, "bias must be fp32, bf16 or fp16");
  g.epilogue = GemmEpilogue::kBiasGrad;  // dbias has M = 8 elements
  g.bias = TensorView(bias.bytes.data(), kBf16, Shape{16});
  expect_refused(g, "must have 8 elements");
  g.epilogue = GemmEpilogue::kNone;
  expect_refused(g, "bias is set but epilogue kNone does not use it");

  GemmArgs h = p.args();
  h.epilogue = GemmEpilogue::kDGelu;
  expect_refused(h, "aux must be set for epilogue kDGelu");
  h.aux = bad_aux.view();
  expect_refused(h, "must be [8, 16] like D");
  h.aux = aux.view();
  h.epilogue = GemmEpilogue::kGelu;
  expect_refused(h, "aux is set but epilogue kGelu does not use it");
}

TEST(GemmErrors, RunBeforeInitialize) {
  Gemm op;
  EXPECT_QMESH_ERROR(op.run(Stream{}), "before a successful Gemm::initialize");
}

// ---- CUDA placement, checked without touching device memory ----------------------------

alignas(64) uint8_t fake_device_memory[1 << 16];
float fake_scalars[3];

TensorView on_cuda(DType t, Shape shape) {
  return TensorView(fake_device_memory, t, std::move(shape), Device::cuda(0));
}

QuantizedTensorView cuda_fp8(DType t, int64_t rows, int64_t cols, bool columnwise) {
  QuantizedTensorView q;
  q.data = on_cuda(t, Shape{rows, cols});
  if (columnwise) q.data_t = on_cuda(t, Shape{cols, rows});
  q.scale = &fake_scalars[0];
  q.scale_inv = &fake_scalars[1];
  q.amax = &fake_scalars[2];
  return q;
}

// An FP8 GEMM on cuda:0: A [m, k] (or [k, m] stored with trans_a), B [n, k] (or [k, n]).
GemmArgs cuda_problem(int64_t m, int64_t n, int64_t k, GemmTranspose ta, GemmTranspose tb,
                      bool columnwise) {
  GemmArgs g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.a = GemmOperand::fp8(ta == GemmTranspose::kNo ? cuda_fp8(kE4, m, k, columnwise)
                                                  : cuda_fp8(kE4, k, m, columnwise));
  g.b = GemmOperand::fp8(tb == GemmTranspose::kYes ? cuda_fp8(kE4, n, k, columnwise)
                                                   : cuda_fp8(kE4, k, n, columnwise));
  g.d = on_cuda(kBf16, Shape{m, n});
  return g;
}

// What can_implement says about an otherwise valid CUDA problem on this machine.
void expect_accepted_or_no_device(const GemmArgs& g) {
  const Status s = Gemm::can_implement(g);
  if (cuda_device_count() > 0) {
    EXPECT_TRUE(s.ok()) << s.reason();
  } else {
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.reason().find("cuda:0"), std::string::npos) << s.reason();
  }
}

TEST(GemmCudaRules, TnLayoutIsAccepted) {
  expect_accepted_or_no_device(
      cuda_problem(64, 32, 48, GemmTranspose::kNo, GemmTranspose::kYes, false));
}

TEST(GemmCudaRules, NonTnFp8NeedsTheColumnwiseCopy) {
  const GemmArgs dgrad = cuda_problem(64, 32, 48, GemmTranspose::kNo, GemmTranspose::kNo, false);
  EXPECT_QMESH_ERROR(gemm(dgrad), "b has none: quantize it with a columnwise copy");
  const Status s = Gemm::can_implement(dgrad);
  EXPECT_NE(s.reason().find("trans_b = kNo"), std::string::npos) << s.reason();
  const GemmArgs wgrad = cuda_problem(64, 32, 48, GemmTranspose::kYes, GemmTranspose::kYes, false);
  EXPECT_QMESH_ERROR(gemm(wgrad), "a has none: quantize it with a columnwise copy");
  // With the columnwise copies every layout is served.
  for (GemmTranspose ta : {GemmTranspose::kNo, GemmTranspose::kYes})
    for (GemmTranspose tb : {GemmTranspose::kNo, GemmTranspose::kYes})
      expect_accepted_or_no_device(cuda_problem(64, 32, 48, ta, tb, true));
}

TEST(GemmCudaRules, Fp8LeadingDimensionsMultipleOf16) {
  expect_refused(
      cuda_problem(64, 32, 50, GemmTranspose::kNo, GemmTranspose::kYes, true),
      "K (leading dimension of A and B in the TN form) to be a multiple of 16, got K = 50");
  expect_refused(cuda_problem(64, 40, 48, GemmTranspose::kNo, GemmTranspose::kYes, true),
                 "N (leading dimension of D) to be a multiple of 16");
  // M is no leading dimension in the TN form.
  expect_accepted_or_no_device(
      cuda_problem(7, 32, 48, GemmTranspose::kNo, GemmTranspose::kYes, true));
  // The same K = 50 problem is fine on the host.
  Matrix a = random_matrix(kE4, 64, 50, 1), b = random_matrix(kE4, 32, 50, 2);
  Matrix d(kBf16, 64, 32);
  const GemmArgs h = tn_args(a, b, d);
  EXPECT_TRUE(Gemm::can_implement(h)) << Gemm::can_implement(h).reason();
}

TEST(GemmCudaRules, PlainDtypesHaveNoLeadingDimensionRule) {
  GemmArgs g;
  g.a = GemmOperand::plain(on_cuda(kBf16, Shape{7, 50}));
  g.b = GemmOperand::plain(on_cuda(kBf16, Shape{50, 9}));
  g.trans_b = GemmTranspose::kNo;
  g.d = on_cuda(kBf16, Shape{7, 9});
  expect_accepted_or_no_device(g);
}

TEST(GemmCudaRules, Fp8NeedsAlignedPointers) {
  GemmArgs g = cuda_problem(64, 32, 48, GemmTranspose::kNo, GemmTranspose::kYes, true);
  g.d.data = fake_device_memory + 2;
  expect_refused(g, "D must be 16-byte aligned");
}

TEST(GemmCudaRules, DeviceMismatch) {
  HostProblem p;
  GemmArgs g = p.args();
  g.a = GemmOperand::fp8(cuda_fp8(kE4, 8, 32, true));
  expect_refused(g, "GemmArgs.a (it must live on D's device)");
  GemmArgs h = cuda_problem(64, 32, 48, GemmTranspose::kNo, GemmTranspose::kYes, true);
  Matrix bias(kBf16, 1, 32);
  h.epilogue = GemmEpilogue::kBias;
  h.bias = TensorView(bias.bytes.data(), kBf16, Shape{32});
  expect_refused(h, "GemmArgs.bias (it must live on D's device)");
}

// A bf16 TN GEMM on cuda:0: A [m, k], B [n, k], D [m, n].
GemmArgs cuda_bf16_problem(int64_t m, int64_t n, int64_t k) {
  GemmArgs g;
  g.a = GemmOperand::plain(on_cuda(kBf16, Shape{m, k}));
  g.b = GemmOperand::plain(on_cuda(kBf16, Shape{n, k}));
  g.d = on_cuda(kBf16, Shape{m, n});
  return g;
}

TEST(GemmCudaRules, EpilogueDtypes) {
  GemmArgs g = cuda_bf16_problem(64, 32, 48);
  g.epilogue = GemmEpilogue::kBias;
  g.bias = on_cuda(kF32, Shape{32});
  expect_refused(g, "the bias of a bf16 GEMM must have D's dtype bf16, got fp32");
  g.epilogue = GemmEpilogue::kDGelu;
  g.bias = TensorView();
  g.aux = on_cuda(DType::kFloat16, Shape{64, 32});
  expect_refused(g, "the aux of a bf16 GEMM must have D's dtype bf16, got fp16");

  GemmArgs h = cuda_problem(64, 32, 48, GemmTranspose::kNo, GemmTranspose::kYes, true);
  h.d = on_cuda(kE4, Shape{64, 32});
  h.d_scale = &fake_scalars[0];
  h.epilogue = GemmEpilogue::kBias;
  h.bias = on_cuda(kF32, Shape{32});
  expect_refused(h, "the bias of a GEMM with an FP8 D must be bf16 or fp16");
  h.bias = on_cuda(kBf16, Shape{32});
  expect_accepted_or_no_device(h);
}

TEST(GemmCudaRules, AuxNeedsNMultipleOf8) {
  GemmArgs g = cuda_bf16_problem(64, 12, 48);
  g.epilogue = GemmEpilogue::kDGelu;
  g.aux = on_cuda(kBf16, Shape{64, 12});
  expect_refused(g, "to be a multiple of 8, got N = 12");
  // Without the aux epilogue N = 12 is fine.
  g.epilogue = GemmEpilogue::kNone;
  g.aux = TensorView();
  expect_accepted_or_no_device(g);
}

TEST(GemmCudaRules, WorkspaceSizeIs32MiBOnCuda) {
  const GemmArgs g = cuda_problem(64, 32, 48, GemmTranspose::kNo, GemmTranspose::kYes, true);
  if (cuda_device_count() == 0) {
    EXPECT_QMESH_ERROR((void)Gemm::workspace_size(g), "cuda:0");
    return;
  }
  EXPECT_EQ(Gemm::workspace_size(g), size_t(32) << 20);
}

}  // namespace
}  // namespace qmesh::test
