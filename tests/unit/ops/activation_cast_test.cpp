// Host backend of the GELU-fused casts (ops/activation_cast.h) against float64 GELU (std::tanh)
// and float64 column sums: every code is a correct rounding of a value within the fp32 GELU's
// approximation error of the float64 one, amax and dbias within that error, and the rowwise
// and columnwise forms, the fused amax ops and the running max agree with each other exactly.
#include "qmesh/ops/activation_cast.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

using test::decode_ref;
using test::encode_ref;
using test::random_wide;
using test::same_bits;
using test::wide_at;

constexpr double kPi = 3.14159265358979323846;

double gelu64(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
}
double dgelu64(double x) {
  const double t = std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x));
  const double du = std::sqrt(2.0 / kPi) * (1.0 + 3.0 * 0.044715 * x * x);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du;
}

// The fp32 GELU's error bound against gelu64 at x: ~2e-7 relative, plus the absolute error of
// 1 + tanh near -1 (an ulp of 1) times |x|.
double gelu_tol(double x, double ref) { return 1e-6 * std::fabs(ref) + 0x1p-21 * std::fabs(x); }
// Likewise for dh · gelu'(x): the ulps of 1 ± t times the factors that multiply them.
double dgelu_tol(double dh, double x, double ref) {
  return 1e-6 * std::fabs(ref) + 0x1p-20 * std::fabs(dh) * (1.0 + std::fabs(x * x * x));
}

// code is a round-to-nearest code of some value within [ref - tol, ref + tol] (scaled).
void expect_code_near(DType fp8, uint8_t code, double ref, double tol, float scale, int64_t i) {
  const float lo = decode_ref(fp8, encode_ref(fp8, float((ref - tol) * scale)));
  const float hi = decode_ref(fp8, encode_ref(fp8, float((ref + tol) * scale)));
  const float got = decode_ref(fp8, code);
  EXPECT_TRUE(got >= lo && got <= hi)
      << "element " << i << ": code " << int(code) << " = " << got << ", expected a code in [" << lo
      << ", " << hi << "] (reference " << ref * scale << ")";
}

// (input dtype, FP8 dtype, rows, cols)
using Param = std::tuple<DType, DType, int64_t, int64_t>;

class ActivationCastTest : public ::testing::TestWithParam<Param> {
 protected:
  DType in() const { return std::get<0>(GetParam()); }
  DType fp8() const { return std::get<1>(GetParam()); }
  int64_t rows() const { return std::get<2>(GetParam()); }
  int64_t cols() const { return std::get<3>(GetParam()); }
  Shape shape() const { return Shape{rows(), cols()}; }
  float scale_for(double amax) const {
    return amax > 0 ? static_cast<float>(fp8_max(fp8()) / amax) : 1.0f;
  }
  // The codes of q's columnwise copy are the transpose of its rowwise codes.
  void expect_transposed(const QuantizedTensor& q) const {
    const auto* c = static_cast<const uint8_t*>(q.data().data());
    const auto* t = static_cast<const uint8_t*>(q.data_t().data());
    for (int64_t r = 0; r < rows(); ++r)
      for (int64_t k = 0; k < cols(); ++k)
        ASSERT_EQ(t[k * rows() + r], c[r * cols() + k]) << r << "," << k;
  }
};

TEST_P(ActivationCastTest, GeluCastTransposeRoundsFloat64Gelu) {
  const Tensor pre = random_wide(in(), shape(), 21);
  std::vector<double> ref(pre.numel());
  double amax64 = 0, amax_tol = 0;
  for (int64_t i = 0; i < pre.numel(); ++i) {
    ref[i] = gelu64(wide_at(pre, i));
    if (std::fabs(ref[i]) > amax64) {
      amax64 = std::fabs(ref[i]);
      amax_tol = gelu_tol(wide_at(pre, i), ref[i]);
    }
  }
  const float scale = scale_for(amax64);
  QuantizedTensor both(fp8(), shape(), Device::host(), true);
  QuantizedTensor rowwise(fp8(), shape(), Device::host(), false);
  *both.view().scale = *rowwise.view().scale = scale;
  gelu_cast_transpose(pre, both.view());
  gelu_cast_transpose(pre, rowwise.view());
  const auto* codes = static_cast<const uint8_t*>(both.data().data());
  for (int64_t i = 0; i < pre.numel(); ++i)
    expect_code_near(fp8(), codes[i], ref[i], gelu_tol(wide_at(pre, i), ref[i]), scale, i);
  expect_transposed(both);
  EXPECT_EQ(std::memcmp(rowwise.data().data(), codes, pre.numel()), 0) << "rowwise-only form";
  EXPECT_NEAR(*both.view().amax, amax64, amax_tol + 1e-7 * amax64);
  EXPECT_TRUE(same_bits(*rowwise.view().amax, *both.view().amax));
  EXPECT_TRUE(same_bits(*both.view().scale_inv, 1.0f / scale));
  float a = -1.0f;
  gelu_amax(pre, TensorView(&a, DType::kFloat32, Shape{1}));
  EXPECT_TRUE(same_bits(a, *both.view().amax)) << "gelu_amax is the cast's amax";
}

TEST_P(ActivationCastTest, DgeluDbiasCastTransposeRoundsFloat64Backward) {
  const Tensor dh = random_wide(in(), shape(), 22);
  const Tensor pre = random_wide(in(), shape(), 23);
  std::vector<double> ref(dh.numel()), tol(dh.numel());
  double amax64 = 0, amax_tol = 0;
  for (int64_t i = 0; i < dh.numel(); ++i) {
    const double x = wide_at(pre, i), g = wide_at(dh, i);
    ref[i] = g * dgelu64(x);
    tol[i] = dgelu_tol(g, x, ref[i]);
    if (std::fabs(ref[i]) > amax64) {
      amax64 = std::fabs(ref[i]);
      amax_tol = tol[i];
    }
  }
  const float scale = scale_for(amax64);
  for (bool columnwise : {true, false}) {
    QuantizedTensor q(fp8(), shape(), Device::host(), columnwise);
    *q.view().scale = scale;
    Tensor dbias(DType::kFloat32, Shape{cols()});
    dgelu_dbias_cast_transpose(dh, pre, q.view(), dbias);
    const auto* codes = static_cast<const uint8_t*>(q.data().data());
    for (int64_t i = 0; i < dh.numel(); ++i)
      expect_code_near(fp8(), codes[i], ref[i], tol[i], scale, i);
    if (columnwise) expect_transposed(q);
    EXPECT_NEAR(*q.view().amax, amax64, amax_tol + 1e-7 * amax64);
    float a = -1.0f;
    dgelu_amax(dh, pre, TensorView(&a, DType::kFloat32, Shape{1}));
    EXPECT_TRUE(same_bits(a, *q.view().amax)) << "dgelu_amax is the cast's amax";
    for (int64_t c = 0; c < cols(); ++c) {
      double sum = 0, sum_abs = 0, sum_tol = 0;
      for (int64_t r = 0; r < rows(); ++r) {
        sum += ref[r * cols() + c];
        sum_abs += std::fabs(ref[r * cols() + c]);
        sum_tol += tol[r * cols() + c];
      }
      // fp32 accumulation: at most rows roundings of a partial sum bounded by sum_abs.
      EXPECT_NEAR(dbias.data_as<float>()[c], sum,
                  sum_tol + 2.0 * double(rows()) * 0x1p-24 * sum_abs)
          << "column " << c;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ActivationCastTest,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                       ::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2),
                       ::testing::Values(1, 3, 64, 130), ::testing::Values(1, 7, 64, 200)),
    [](const ::testing::TestParamInfo<Param>& p) {
      return std::string(dtype_name(std::get<0>(p.param))) + "_" +
             std::string(dtype_name(std::get<1>(p.param))) + "_" +
             std::to_string(std::get<2>(p.param)) + "x" + std::to_string(std::get<3>(p.param));
    });

// +inf -> gelu = +inf (saturates); -inf -> 0.5 · -inf · 0 = NaN, as the GELU of the layers;
// NaN stays NaN; the amax of a NaN result is the canonical NaN 0x7FFFFFFF on every backend.
TEST(ActivationCast, InfinitiesAndNanFollowTheDocumentedRules) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {inf, 1.0f, 0.0f, -inf, std::numeric_limits<float>::quiet_NaN(), -2.0f};
  const TensorView x(v.data(), DType::kFloat32, Shape{2, 3});
  QuantizedTensor q(DType::kFloat8E4M3, Shape{2, 3}, Device::host(), true);
  gelu_cast_transpose(x, q.view());
  const auto* c = static_cast<const uint8_t*>(q.data().data());
  EXPECT_EQ(c[0], 0x7E);  // +448
  EXPECT_EQ(c[1], encode_ref(DType::kFloat8E4M3, float(gelu64(1.0))));
  EXPECT_EQ(c[2], 0x00);
  EXPECT_EQ(c[3], 0x7F);  // NaN
  EXPECT_EQ(c[4], 0x7F);
  uint32_t bits;
  std::memcpy(&bits, q.view().amax, 4);
  EXPECT_EQ(bits, 0x7FFFFFFFu);

  std::vector<float> ones(6, 1.0f), dbias(3);
  QuantizedTensor g(DType::kFloat8E5M2, Shape{2, 3}, Device::host(), false);
  dgelu_dbias_cast_transpose(TensorView(ones.data(), DType::kFloat32, Shape{2, 3}), x, g.view(),
                             TensorView(dbias.data(), DType::kFloat32, Shape{3}));
  std::memcpy(&bits, g.view().amax, 4);
  EXPECT_EQ(bits, 0x7FFFFFFFu);  // gelu'(+inf) = 0.5·2 + inf·0 = NaN
  EXPECT_TRUE(std::isnan(dbias[0]));
  EXPECT_NEAR(dbias[2], dgelu64(0.0) + dgelu64(-2.0), 1e-6);
}

TEST(ActivationCast, BadArgumentsAreRefused) {
  Tensor pre(DType::kFloat32, Shape{4, 8}), dh(DType::kFloat32, Shape{4, 8});
  Tensor pre16(DType::kBFloat16, Shape{4, 8}), short_pre(DType::kFloat32, Shape{3, 8});
  Tensor dbias(DType::kFloat32, Shape{8}), amax_out(DType::kFloat32, Shape{1});
  QuantizedTensor q(DType::kFloat8E5M2, Shape{4, 8}, Device::host(), false);
  EXPECT_QMESH_ERROR(dgelu_dbias_cast_transpose(dh, pre16, q.view(), dbias),
                     "dgelu_dbias_cast_transpose pre-activation must have dtype fp32");
  EXPECT_QMESH_ERROR(dgelu_dbias_cast_transpose(dh, short_pre, q.view(), dbias),
                     "must have the gradient's 32 elements");
  EXPECT_QMESH_ERROR(dgelu_dbias_cast_transpose(dh, TensorView(), q.view(), dbias),
                     "pre-activation is an empty view");
  EXPECT_QMESH_ERROR(
      dgelu_dbias_cast_transpose(dh, pre, q.view(), Tensor(DType::kFloat32, Shape{4})),
      "dbias must have shape [8]");
  EXPECT_QMESH_ERROR(gelu_cast_transpose(short_pre, q.view()),
                     "gelu_cast_transpose pre-activation must be a [4, 8] matrix");
  EXPECT_QMESH_ERROR(gelu_cast_transpose(TensorView(), q.view()), "is an empty view");
  EXPECT_QMESH_ERROR(dgelu_amax(dh, short_pre, amax_out), "dgelu_amax pre-activation");
  EXPECT_QMESH_ERROR(gelu_amax(pre, dbias), "amax output must hold one fp32 element");
}

}  // namespace
}  // namespace qmesh
