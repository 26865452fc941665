// FP8 conversions against the published format definitions (OCP FP8, arXiv 2209.05433),
// computed here in float64 from sign, exponent and mantissa fields.
#include "qmesh/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "expect_error.h"
#include "qmesh/float16.h"

namespace qmesh {
namespace {

struct Format {
  DType dtype;
  int mantissa_bits;
  int bias;
  uint8_t (*encode)(float);
  float (*decode)(uint8_t);
};
void PrintTo(const Format& f, std::ostream* os) { *os << dtype_name(f.dtype); }

const Format kE4M3{DType::kFloat8E4M3, 3, 7, float_to_e4m3, e4m3_to_float};
const Format kE5M2{DType::kFloat8E5M2, 2, 15, float_to_e5m2, e5m2_to_float};

// The value a code stands for, from its fields; NaN for NaN codes, inf for E5M2 inf.
double reference_decode(const Format& f, uint8_t code) {
  const int sign = code >> 7;
  const int exp = (code >> f.mantissa_bits) & ((1 << (7 - f.mantissa_bits)) - 1);
  const int man = code & ((1 << f.mantissa_bits) - 1);
  const int exp_max = (1 << (7 - f.mantissa_bits)) - 1;
  double v;
  if (f.dtype == DType::kFloat8E4M3 && exp == exp_max && man == (1 << f.mantissa_bits) - 1)
    v = std::numeric_limits<double>::quiet_NaN();
  else if (f.dtype == DType::kFloat8E5M2 && exp == exp_max)
    v = man == 0 ? std::numeric_limits<double>::infinity()
                 : std::numeric_limits<double>::quiet_NaN();
  else if (exp == 0)
    v = std::ldexp(man, 1 - f.bias - f.mantissa_bits);
  else
    v = std::ldexp(1.0 + std::ldexp(man, -f.mantissa_bits), exp - f.bias);
  return sign ? -v : v;
}

class Fp8Format : public testing::TestWithParam<Format> {};

TEST_P(Fp8Format, AllCodesDecodeToTheirDefinition) {
  const Format f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const double want = reference_decode(f, uint8_t(c));
    const float got = f.decode(uint8_t(c));
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(got)) << "code " << c;
    else
      EXPECT_EQ(double(got), want) << "code " << c;
  }
}

// Nearest-even rounding with saturation, by brute force over all finite codes in float64.
uint8_t reference_encode(const Format& f, float x) {
  if (std::isnan(x)) return 0x7F;
  const double max = f.dtype == DType::kFloat8E4M3 ? 448.0 : 57344.0;
  double v = std::clamp(double(x), -max, max);
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    const double d = reference_decode(f, uint8_t(c));
    if (!std::isfinite(d) || std::signbit(d) != std::signbit(v)) continue;
    const double err = std::abs(d - v);
    const bool even = (c & 1) == 0;
    if (best < 0 || err < best_err || (err == best_err && even)) {
      best = c;
      best_err = err;
    }
  }
  return uint8_t(best);
}

TEST_P(Fp8Format, EncodeMatchesNearestEvenOnRandomAndEdgeValues) {
  const Format f = GetParam();
  std::vector<float> values = {0.0f,
                               -0.0f,
                               1.0f,
                               -1.0f,
                               448.0f,
                               449.0f,
                               464.0f,
                               480.0f,
                               57344.0f,
                               61440.0f,
                               1e30f,
                               -1e30f,
                               std::numeric_limits<float>::infinity(),
                               -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::denorm_min(),
                               std::ldexp(1.0f, -10),
                               std::ldexp(1.0f, -17),
                               std::ldexp(1.5f, -10),
                               std::ldexp(1.0f, -6)};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> exponent(-20.0f, 17.0f);
  for (int i = 0; i < 20000; ++i) {
    const float mag = std::exp2(exponent(rng));
    values.push_back(rng() & 1 ? mag : -mag);
  }
  // Exact midpoints between neighbouring codes exercise the ties-to-even rule.
  for (int c = 0; c < 0x7E; ++c) {
    const double a = reference_decode(f, uint8_t(c)), b = reference_decode(f, uint8_t(c + 1));
    if (std::isfinite(a) && std::isfinite(b)) values.push_back(float((a + b) / 2));
  }
  for (float x : values) EXPECT_EQ(int(f.encode(x)), int(reference_encode(f, x))) << "x = " << x;
}

TEST_P(Fp8Format, NaNIsCanonicalAndSaturationKeepsSign) {
  const Format f = GetParam();
  EXPECT_EQ(f.encode(std::numeric_limits<float>::quiet_NaN()), 0x7F);
  EXPECT_EQ(f.encode(-std::numeric_limits<float>::quiet_NaN()), 0x7F);
  const uint8_t max_code = f.dtype == DType::kFloat8E4M3 ? 0x7E : 0x7B;
  EXPECT_EQ(f.encode(std::numeric_limits<float>::infinity()), max_code);
  EXPECT_EQ(f.encode(-std::numeric_limits<float>::infinity()), max_code | 0x80);
  EXPECT_EQ(double(f.decode(max_code)), double(fp8_max(f.dtype)));
}

TEST_P(Fp8Format, ArrayVersionsEqualScalarWithScale) {
  const Format f = GetParam();
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 100.0f);
  const size_t n = 1037;  // not a multiple of any vector width
  std::vector<float> x(n);
  std::vector<uint16_t> xb(n), xh(n);
  for (size_t i = 0; i < n; ++i) {
    x[i] = dist(rng);
    xb[i] = float_to_bf16(x[i]);
    xh[i] = float_to_fp16(x[i]);
  }
  const float scale = 3.5f;
  std::vector<uint8_t> q(n), qb(n), qh(n);
  fp32_to_fp8(x.data(), q.data(), n, f.dtype, scale);
  bf16_to_fp8(xb.data(), qb.data(), n, f.dtype, scale);
  fp16_to_fp8(xh.data(), qh.data(), n, f.dtype, scale);
  std::vector<float> back(n);
  fp8_to_fp32(q.data(), back.data(), n, f.dtype, 1.0f / scale);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_EQ(q[i], f.encode(x[i] * scale)) << i;
    ASSERT_EQ(qb[i], f.encode(bf16_to_float(xb[i]) * scale)) << i;
    ASSERT_EQ(qh[i], f.encode(fp16_to_float(xh[i]) * scale)) << i;
    ASSERT_EQ(back[i], f.decode(q[i]) * (1.0f / scale)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Format, testing::Values(kE4M3, kE5M2), [](const auto& p) {
  return p.param.dtype == DType::kFloat8E4M3 ? "E4M3" : "E5M2";
});

TEST(Fp8, NonFp8DTypeIsAnError) {
  float x = 1;
  uint8_t q;
  EXPECT_QMESH_ERROR(fp32_to_fp8(&x, &q, 1, DType::kBFloat16, 1.0f),
                     "FP8 conversion needs dtype fp8e4m3 or fp8e5m2, got bf16");
  EXPECT_QMESH_ERROR(fp8_max(DType::kInt32), "got int32");
}

}  // namespace
}  // namespace qmesh
