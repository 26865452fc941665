// Host GEMM against a float64 reference on the dequantized inputs: every dtype combination,
// every epilogue, accumulation, all four layouts, odd shapes.
#include "qmesh/ops/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "expect_error.h"
#include "gemm_test_util.h"

namespace qmesh::test {
namespace {

struct Case {
  DType a, b, d;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  GemmOutputMode mode = GemmOutputMode::kWrite;
  int64_t m = 37, n = 24, k = 50;  // non-square, K not a multiple of 16
  GemmTranspose ta = GemmTranspose::kNo, tb = GemmTranspose::kYes;
  DType side = DType::kBFloat16;  // bias / aux dtype
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::string s = std::string(dtype_name(c.a)) + "x" + std::string(dtype_name(c.b)) + "_to_" +
                  std::string(dtype_name(c.d)) + "_" + gemm_epilogue_name(c.epilogue) +
                  (c.mode == GemmOutputMode::kAccumulate ? "_acc" : "") + "_" +
                  std::to_string(c.m) + "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
                  "_" + (c.ta == GemmTranspose::kYes ? "T" : "N") +
                  (c.tb == GemmTranspose::kYes ? "T" : "N") + "_" + std::string(dtype_name(c.side));
  return s;
}

// Runs one case through qmesh::gemm and checks D, aux, dbias and amax(D).
void run_case(const Case& c) {
  const bool at = c.ta == GemmTranspose::kYes, bt = c.tb == GemmTranspose::kYes;
  Matrix a = at ? random_matrix(c.a, c.k, c.m, 1) : random_matrix(c.a, c.m, c.k, 1);
  Matrix b = bt ? random_matrix(c.b, c.n, c.k, 2) : random_matrix(c.b, c.k, c.n, 2);
  const bool fp8_d = is_fp8(c.d);

  GemmArgs args;
  args.a = a.operand();
  args.b = b.operand();
  args.trans_a = c.ta;
  args.trans_b = c.tb;
  args.alpha = 0.75f;
  args.output = c.mode;
  args.epilogue = c.epilogue;

  Matrix d(c.d, c.m, c.n);
  std::vector<double> d_old(size_t(c.m * c.n), 0.0);
  if (c.mode == GemmOutputMode::kAccumulate) {
    d = random_matrix(c.d, c.m, c.n, 3);
    d_old = d.values();
  }
  Matrix bias, aux;
  std::vector<double> bias_v, aux_v;
  if (c.epilogue == GemmEpilogue::kBias || c.epilogue == GemmEpilogue::kBiasGeluAux) {
    bias = random_matrix(c.side, 1, c.n, 4);
    bias_v = bias.values();
    args.bias = TensorView(bias.bytes.data(), c.side, Shape{c.n});
  }
  if (c.epilogue == GemmEpilogue::kBiasGrad) {
    bias = Matrix(c.side, 1, c.m);
    args.bias = TensorView(bias.bytes.data(), c.side, Shape{c.m});
  }
  if (c.epilogue == GemmEpilogue::kDGelu) {
    aux = random_matrix(c.side, c.m, c.n, 5, 3.0);
    aux_v = aux.values();
    args.aux = aux.view();
  }
  if (c.epilogue == GemmEpilogue::kBiasGeluAux) {
    aux = Matrix(c.side, c.m, c.n);
    args.aux = aux.view();
  }

  const Reference ref =
      reference_gemm(a, c.ta, b, c.tb, args.alpha, c.epilogue, c.mode, d_old, bias_v, aux_v);
  float d_scale = 1.0f, d_amax = -1.0f;
  double ref_amax = 0;
  for (double v : ref.d) ref_amax = std::max(ref_amax, std::fabs(v));
  if (fp8_d) {
    // A power of two that maps amax to between half and all of the FP8 range.
    d_scale = std::exp2(std::floor(std::log2(fp8_max(c.d) / ref_amax)));
    args.d_scale = &d_scale;
    args.d_amax = &d_amax;
  }
  args.d = d.view();

  ASSERT_TRUE(Gemm::can_implement(args)) << Gemm::can_implement(args).reason();
  gemm(args);

  std::vector<double> out = d.values();
  if (fp8_d)
    for (double& v : out) v /= d_scale;
  EXPECT_LE(relative_error(out, ref.d), output_tolerance(c.d));
  if (fp8_d) {
    EXPECT_NEAR(d_amax, ref_amax, 1e-5 * ref_amax);
  }
  if (c.epilogue == GemmEpilogue::kBiasGeluAux) {
    EXPECT_LE(relative_error(aux.values(), ref.aux), output_tolerance(c.side));
  }
  if (c.epilogue == GemmEpilogue::kBiasGrad) {
    EXPECT_LE(relative_error(bias.values(), ref.dbias), output_tolerance(c.side));
  }
}

void PrintTo(const Case& c, std::ostream* os) {
  *os << case_name(testing::TestParamInfo<Case>(c, 0));
}

class GemmHost : public testing::TestWithParam<Case> {};
TEST_P(GemmHost, MatchesFloat64Reference) { run_case(GetParam()); }

constexpr DType kE4 = DType::kFloat8E4M3, kE5 = DType::kFloat8E5M2, kF32 = DType::kFloat32,
                kBf16 = DType::kBFloat16, kF16 = DType::kFloat16;
constexpr GemmEpilogue kEpilogues[] = {GemmEpilogue::kNone,  GemmEpilogue::kBias,
                                       GemmEpilogue::kGelu,  GemmEpilogue::kBiasGeluAux,
                                       GemmEpilogue::kDGelu, GemmEpilogue::kBiasGrad};

// Every input combination × every output dtype × every epilogue (and kAccumulate where D
// allows it), cycling through the four layouts and the three side dtypes.
std::vector<Case> dtype_epilogue_cases() {
  struct Inputs {
    DType a, b;
  };
  const Inputs inputs[] = {{kE4, kE4},   {kE4, kE5},     {kE5, kE4},
                           {kF32, kF32}, {kBf16, kBf16}, {kF16, kF16}};
  const DType sides[] = {kBf16, kF32, kF16};
  std::vector<Case> cases;
  int i = 0;
  for (const Inputs& in : inputs) {
    for (DType d : {kF32, kBf16, kF16, kE4, kE5}) {
      if (is_fp8(d) && !is_fp8(in.a)) continue;
      for (GemmEpilogue e : kEpilogues) {
        for (GemmOutputMode mode : {GemmOutputMode::kWrite, GemmOutputMode::kAccumulate}) {
          if (mode == GemmOutputMode::kAccumulate && is_fp8(d)) continue;
          Case c{in.a, in.b, d, e, mode};
          c.ta = (i & 1) ? GemmTranspose::kYes : GemmTranspose::kNo;
          c.tb = (i & 2) ? GemmTranspose::kNo : GemmTranspose::kYes;
          c.side = sides[i % 3];
          ++i;
          cases.push_back(c);
        }
      }
    }
  }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(DTypesEpilogues, GemmHost, testing::ValuesIn(dtype_epilogue_cases()),
                         case_name);

// Shapes (vectors, K = 1, odd sizes, a 16-aligned one) in all four layouts.
std::vector<Case> shape_cases() {
  struct Mnk {
    int64_t m, n, k;
  };
  const Mnk shapes[] = {{1, 1, 1},    {1, 40, 33}, {40, 1, 33},   {17, 5, 1},
                        {64, 48, 32}, {3, 130, 7}, {129, 65, 100}};
  std::vector<Case> cases;
  for (const Mnk& s : shapes)
    for (GemmTranspose ta : {GemmTranspose::kNo, GemmTranspose::kYes})
      for (GemmTranspose tb : {GemmTranspose::kNo, GemmTranspose::kYes}) {
        Case c{kE4, kE4, kBf16, GemmEpilogue::kBias};
        c.m = s.m;
        c.n = s.n;
        c.k = s.k;
        c.ta = ta;
        c.tb = tb;
        cases.push_back(c);
      }
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Shapes, GemmHost, testing::ValuesIn(shape_cases()), case_name);

// A small panel budget splits K into several panels and D into row blocks (the path that
// large GEMMs take), with every epilogue that reads or writes per-row state.
class GemmHostPanels : public testing::TestWithParam<Case> {
 protected:
  void SetUp() override { setenv("QMESH_GEMM_HOST_PANEL_MIB", "1", 1); }
  void TearDown() override { unsetenv("QMESH_GEMM_HOST_PANEL_MIB"); }
};
TEST_P(GemmHostPanels, MatchesFloat64Reference) { run_case(GetParam()); }

std::vector<Case> panel_cases() {
  std::vector<Case> cases;
  for (GemmEpilogue e : {GemmEpilogue::kNone, GemmEpilogue::kBiasGrad, GemmEpilogue::kBiasGeluAux})
    for (GemmTranspose ta : {GemmTranspose::kNo, GemmTranspose::kYes}) {
      Case c{kE4, kE5, kBf16, e};
      c.m = 100;
      c.n = 2000;
      c.k = 600;
      c.ta = ta;
      c.tb = ta == GemmTranspose::kYes ? GemmTranspose::kNo : GemmTranspose::kYes;
      c.side = kF32;
      cases.push_back(c);
    }
  Case fp8_out{kE4, kE4, kE4, GemmEpilogue::kGelu};  // amax over several row blocks
  fp8_out.m = 100;
  fp8_out.n = 2000;
  fp8_out.k = 600;
  cases.push_back(fp8_out);
  Case acc{kBf16, kBf16, kBf16, GemmEpilogue::kNone, GemmOutputMode::kAccumulate};
  acc.m = 100;
  acc.n = 2000;
  acc.k = 600;
  cases.push_back(acc);
  return cases;
}
INSTANTIATE_TEST_SUITE_P(Panels, GemmHostPanels, testing::ValuesIn(panel_cases()), case_name);

// amax(D) of an FP8 output is exactly max |r| of the fp32 result before D's scaling: the same
// GEMM with an fp32 D gives r, and the FP8 codes are exactly sat_rne(r · scale).
TEST(GemmHostFp8Output, AmaxIsThatOfTheUnscaledFp32Result) {
  for (GemmEpilogue e : {GemmEpilogue::kNone, GemmEpilogue::kGelu}) {
    Matrix a = random_matrix(kE4, 33, 70, 11);
    Matrix b = random_matrix(kE4, 48, 70, 12);
    Matrix d32(kF32, 33, 48), d8(kE4, 33, 48);
    GemmArgs args = tn_args(a, b, d32);
    args.epilogue = e;
    gemm(args);
    const std::vector<double> r = d32.values();
    double amax = 0;
    for (double v : r) amax = std::max(amax, std::fabs(v));

    float scale = 8.0f, d_amax = -1.0f;
    args.d = d8.view();
    args.d_scale = &scale;
    args.d_amax = &d_amax;
    gemm(args);
    EXPECT_EQ(double(d_amax), amax);
    for (size_t i = 0; i < r.size(); ++i)
      ASSERT_EQ(d8.bytes[i], float_to_e4m3(float(r[i]) * scale)) << "element " << i;

    // A NaN in the result makes amax NaN, so that the scaling update keeps its scale.
    a.bytes[5] = 0x7F;  // e4m3 NaN
    gemm(args);
    EXPECT_TRUE(std::isnan(d_amax));
  }
}

// The lifecycle API with a caller-provided workspace gives the one-shot result, and may run
// again on the same tensors.
TEST(GemmLifecycle, InitializeThenRunWithOwnWorkspace) {
  Matrix a = random_matrix(kE4, 20, 40, 21);
  Matrix b = random_matrix(kE5, 40, 30, 22);
  Matrix d(kBf16, 20, 30), d_ref(kBf16, 20, 30);
  GemmArgs args = tn_args(a, b, d_ref);
  args.trans_b = GemmTranspose::kNo;
  gemm(args);

  args.d = d.view();
  const size_t ws_bytes = Gemm::workspace_size(args);
  EXPECT_GT(ws_bytes, 0u);
  std::vector<uint8_t> ws(ws_bytes);
  Gemm op;
  op.initialize(args, ws.data(), Stream{});
  op.run(Stream{});
  EXPECT_EQ(d.bytes, d_ref.bytes);
  std::fill(d.bytes.begin(), d.bytes.end(), 0);
  op.run(Stream{});
  EXPECT_EQ(d.bytes, d_ref.bytes);
}

// gemm_planned on the host computes what gemm() does, bit for bit, call after call.
TEST(GemmLifecycle, PlannedEqualsOneShotOnTheHost) {
  for (uint32_t seed = 0; seed < 2; ++seed) {
    Matrix a = random_matrix(kE4, 20, 40, 41 + seed);
    Matrix b = random_matrix(kE4, 30, 40, 51 + seed);
    Matrix d(kBf16, 20, 30), d_ref(kBf16, 20, 30);
    GemmArgs args = tn_args(a, b, d_ref);
    gemm(args);
    args.d = d.view();
    gemm_planned(args, nullptr, Stream{});
    EXPECT_EQ(d.bytes, d_ref.bytes) << "seed " << seed;
  }
}

// A caller's workspace that became too small (the panel budget grew after initialize) is an
// error, not an overflow.
TEST(GemmLifecycle, WorkspaceThatBecameTooSmall) {
  Matrix a = random_matrix(kE4, 300, 600, 23);
  Matrix b = random_matrix(kE4, 200, 600, 24);
  Matrix d(kBf16, 300, 200);
  const GemmArgs args = tn_args(a, b, d);
  setenv("QMESH_GEMM_HOST_PANEL_MIB", "1", 1);
  std::vector<uint8_t> ws(Gemm::workspace_size(args));
  Gemm op;
  op.initialize(args, ws.data(), Stream{});
  unsetenv("QMESH_GEMM_HOST_PANEL_MIB");
  EXPECT_QMESH_ERROR(op.run(Stream{}), "initialize again with a new workspace");
}

// The host backend reads the rowwise copy, so FP8 operands without a columnwise copy work
// in every layout.
TEST(GemmHostLayouts, Fp8WithoutColumnwiseCopyWorksOnTheHost) {
  Matrix a = random_matrix(kE4, 24, 16, 31);  // stored [K, M]: used transposed
  Matrix b = random_matrix(kE4, 24, 8, 32);   // stored [K, N]
  Matrix d(kF32, 16, 8);
  GemmArgs args;
  args.a = a.operand(false);
  args.b = b.operand(false);
  args.trans_a = GemmTranspose::kYes;
  args.trans_b = GemmTranspose::kNo;
  args.d = d.view();
  gemm(args);
  const Reference ref = reference_gemm(a, args.trans_a, b, args.trans_b, 1.0, GemmEpilogue::kNone,
                                       GemmOutputMode::kWrite, {}, {}, {});
  EXPECT_LE(relative_error(d.values(), ref.d), 1e-5);
}

}  // namespace
}  // namespace qmesh::test
