// nvfp4_quantize / nvfp4_dequantize on the host against references computed here: E2M1 by
// nearest-even over its 8 magnitudes (the float4_e2m1fn table of ml_dtypes), E4M3 by qmesh/fp8.h
// (checked against CUDA for every fp32 input), and the scale rule of docs/numerics.md "NVFP4"
// in float64, each fp32 operation of the rule rounded to fp32 once.
#include "qmesh/ops/nvfp4_quantize.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "expect_error.h"
#include "ops/nvfp4_rules.h"
#include "qmesh/fp8.h"
#include "qmesh/nvfp4_tensor.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

namespace rules = detail::nvfp4;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();
// float4_e2m1fn magnitudes of codes 0..7 (ml_dtypes.float4_e2m1fn; OCP MX spec).
constexpr double kE2M1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

// Nearest-even E2M1 code of x, saturating; NaN gives +6 (docs/numerics.md "NVFP4").
uint8_t e2m1_ref(float x) {
  if (std::isnan(x)) return 7;
  const double a = std::fabs(double(x));
  uint8_t k = 7;
  if (a < 6.0) {
    k = 0;
    while (a >= kE2M1[k + 1]) ++k;
    const double mid = (kE2M1[k] + kE2M1[k + 1]) / 2;
    if (a > mid || (a == mid && k % 2 == 1)) ++k;
  }
  return uint8_t((std::signbit(x) ? 8 : 0) | k);
}

double e2m1_value(uint8_t code) { return (code & 8 ? -1 : 1) * kE2M1[code & 7]; }

float f32(double x) { return static_cast<float>(x); }

// The per-tensor and block steps of the rule in float64, each fp32 operation rounded once.
float global_encode_ref(double amax) {
  if (!(amax > 0) || !(amax <= FLT_MAX)) return 1.0f;
  return std::min(f32(2688.0 / amax), FLT_MAX);
}
uint8_t block_scale_ref(double block_amax, float global_encode) {
  const float t = f32(double(global_encode) * double(1.0f / 6.0f));
  const double s = std::isnan(block_amax) ? DBL_MAX : double(f32(block_amax * t));
  return float_to_e4m3(f32(std::min(s, double(FLT_MAX))));
}
float factor_ref(uint8_t scale, float global_decode) {
  const double f = 1.0 / double(f32(double(e4m3_to_float(scale)) * global_decode));
  return f32(std::min(f, double(FLT_MAX)));
}

struct CopyRef {
  std::vector<uint8_t> codes;  // one per element, unpacked
  std::vector<uint8_t> scale;
  float scale_inv = 0;
};

// The expected copy of a [rows, cols] row-major array v (already transposed / transformed).
CopyRef reference(const std::vector<float>& v, int64_t rows, int64_t cols, bool tiles) {
  const int64_t nb = cols / 16;
  std::vector<double> amax(size_t(rows * nb), 0.0);
  double global = 0;
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const double a = std::fabs(double(v[i * cols + j]));
      double& m = amax[i * nb + j / 16];
      m = std::isnan(a) || std::isnan(m) ? double(kNan) : std::max(m, a);
      global = std::isnan(m) || std::isnan(global) ? double(kNan) : std::max(global, m);
    }
  if (tiles)
    for (int64_t i0 = 0; i0 < rows; i0 += 16)
      for (int64_t kb = 0; kb < nb; ++kb) {
        double t = 0;
        for (int64_t i = i0; i < i0 + 16; ++i) {
          const double m = amax[i * nb + kb];
          t = std::isnan(m) || std::isnan(t) ? double(kNan) : std::max(t, m);
        }
        for (int64_t i = i0; i < i0 + 16; ++i) amax[i * nb + kb] = t;
      }
  CopyRef r;
  const float enc = global_encode_ref(global), dec = f32(1.0 / double(enc));
  r.scale_inv = global <= FLT_MAX ? dec : kNan;  // a non-finite tensor decodes to NaN
  r.codes.resize(v.size());
  r.scale.resize(amax.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t kb = 0; kb < nb; ++kb) {
      const uint8_t s = block_scale_ref(amax[i * nb + kb], enc);
      r.scale[i * nb + kb] = s;
      const float f = factor_ref(s, dec);
      for (int64_t j = kb * 16; j < kb * 16 + 16; ++j)
        r.codes[i * cols + j] = e2m1_ref(f32(double(v[i * cols + j]) * f));
    }
  return r;
}

std::vector<uint8_t> unpack(const Tensor& packed) {
  std::vector<uint8_t> out;
  const auto* p = static_cast<const uint8_t*>(packed.data());
  for (int64_t k = 0; k < packed.numel(); ++k) {
    out.push_back(p[k] & 0xF);
    out.push_back(uint8_t(p[k] >> 4));
  }
  return out;
}

std::vector<uint8_t> bytes(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return {p, p + t.nbytes()};
}

std::vector<float> as_floats(const Tensor& t) {
  std::vector<float> v(size_t(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = test::wide_at(t, i);
  return v;
}

std::vector<float> transpose(const std::vector<float>& v, int64_t rows, int64_t cols) {
  std::vector<float> t(v.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[j * rows + i] = v[i * cols + j];
  return t;
}

void expect_copy(const CopyRef& want, const Tensor& data, const Tensor& scale,
                 const Tensor& scale_inv, const char* what) {
  EXPECT_EQ(unpack(data), want.codes) << what;
  EXPECT_EQ(bytes(scale), want.scale) << what;
  EXPECT_EQ(std::bit_cast<uint32_t>(*scale_inv.data_as<float>()),
            std::bit_cast<uint32_t>(want.scale_inv))
      << what;
}

TEST(NvFp4Elements, E2M1DecodeMatchesTheTable) {
  for (int code = 0; code < 16; ++code)
    EXPECT_EQ(double(rules::decode_e2m1(uint8_t(code))), e2m1_value(uint8_t(code))) << code;
}

// Every bf16 bit pattern (all exponents, both signs, inf, NaN) plus every fp32 within 4096 ulps
// of each E2M1 value and rounding midpoint.
TEST(NvFp4Elements, E2M1EncodeMatchesNearestEven) {
  std::vector<float> xs;
  for (uint32_t h = 0; h < 0x10000; ++h) xs.push_back(std::bit_cast<float>(h << 16));
  for (double m :
       {0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 7.0}) {
    const uint32_t b = std::bit_cast<uint32_t>(float(m));
    for (uint32_t d = 0; d < 4096; ++d)
      for (uint32_t bits : {b + d, b - d, (b + d) | 0x80000000u})
        if ((bits & 0x7FFFFFFFu) < 0x7F800000u) xs.push_back(std::bit_cast<float>(bits));
  }
  for (float x : xs) ASSERT_EQ(rules::encode_e2m1(x, false, 0), e2m1_ref(x)) << "x = " << x;
}

// Scale codes against qmesh/fp8.h's saturating nearest-even encoder on every 61st fp32 pattern
// from 0 to infinity and every pattern within 64 ulps of each E4M3 value and midpoint.
TEST(NvFp4Elements, E4M3ScaleEncodingMatchesFp8) {
  for (uint64_t b = 0; b <= 0x7F800000u; b += 61) {
    const float x = std::bit_cast<float>(uint32_t(b));
    ASSERT_EQ(rules::encode_e4m3_scale(x), float_to_e4m3(x)) << x;
  }
  for (int code = 0; code < 0x7F; ++code) {
    const float lo = e4m3_to_float(uint8_t(code)), hi = e4m3_to_float(uint8_t(code + 1));
    EXPECT_EQ(rules::decode_e4m3_scale(uint8_t(code)), lo);
    for (float c : {lo, code < 0x7E ? f32((double(lo) + hi) / 2) : 464.0f}) {
      const uint32_t b = std::bit_cast<uint32_t>(c);
      for (uint32_t d = 0; d < 64; ++d)
        for (uint32_t bits : {b + d, b - d})
          if (bits < 0x7F800000u) {
            const float x = std::bit_cast<float>(bits);
            ASSERT_EQ(rules::encode_e4m3_scale(x), float_to_e4m3(x)) << x;
          }
    }
  }
}

struct Case {
  DType dtype;
  int64_t rows, cols;
  bool tiles;
};

class NvFp4Quantize : public ::testing::TestWithParam<Case> {};

TEST_P(NvFp4Quantize, NearestEvenMatchesTheFloat64Rule) {
  const Case c = GetParam();
  Tensor x = test::random_wide(c.dtype, Shape{c.rows, c.cols}, 7);
  // A zero block, a block with one huge value (tiny neighbours' scale underflows), and a
  // block whose scale saturates.
  for (int64_t j = 0; j < 16; ++j) test::set_wide(x, 16 + j, 0.0f);
  test::set_wide(x, c.cols + 3, 3.0e4f);
  NvFp4Tensor q(Shape{c.rows, c.cols}, Device::host(), true);
  NvFp4Options o;
  o.tiles_2d = c.tiles;
  nvfp4_quantize(x, q.view(), o);
  const std::vector<float> v = as_floats(x);
  expect_copy(reference(v, c.rows, c.cols, c.tiles), q.data(), q.scale(), q.scale_inv(), "rowwise");
  expect_copy(reference(transpose(v, c.rows, c.cols), c.cols, c.rows, c.tiles), q.data_t(),
              q.scale_t(), q.scale_inv_t(), "columnwise");
  if (c.tiles) {  // one scale per 16x16 tile, repeated on its 16 rows
    const auto* s = static_cast<const uint8_t*>(q.scale().data());
    const int64_t nb = c.cols / 16;
    for (int64_t i = 0; i < c.rows; ++i)
      for (int64_t kb = 0; kb < nb; ++kb) ASSERT_EQ(s[i * nb + kb], s[(i / 16 * 16) * nb + kb]);
  }

  // Dequantization: (e2m1 * e4m3) * scale_inv, exactly.
  Tensor out(DType::kFloat32, Shape{c.rows, c.cols});
  nvfp4_dequantize(q.view(), out);
  const CopyRef r = reference(v, c.rows, c.cols, c.tiles);
  for (int64_t i = 0; i < c.rows * c.cols; ++i) {
    const double want =
        e2m1_value(r.codes[i]) *
        double(e4m3_to_float(r.scale[i / c.cols * (c.cols / 16) + i % c.cols / 16]));
    ASSERT_EQ(out.data_as<float>()[i], f32(want * r.scale_inv)) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, NvFp4Quantize,
                         ::testing::Values(Case{DType::kFloat32, 32, 48, false},
                                           Case{DType::kBFloat16, 64, 32, false},
                                           Case{DType::kFloat16, 16, 16, false},
                                           Case{DType::kFloat32, 48, 64, true},
                                           Case{DType::kBFloat16, 32, 32, true}));

TEST(NvFp4Quantize, NonFiniteValues) {
  Tensor x(DType::kFloat32, Shape{16, 32});
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = float(i % 5) - 2.0f;
  x.data_as<float>()[5] = kNan;
  x.data_as<float>()[40] = kInf;
  NvFp4Tensor q(Shape{16, 32}, Device::host(), true);
  nvfp4_quantize(x, q.view(), NvFp4Options{});
  const std::vector<float> v = as_floats(x);
  const CopyRef r = reference(v, 16, 32, false);
  expect_copy(r, q.data(), q.scale(), q.scale_inv(), "rowwise");
  EXPECT_TRUE(std::isnan(r.scale_inv));  // NaN amax: the stored decode scale is NaN
  EXPECT_EQ(r.codes[5], 7);              // NaN -> +6
  EXPECT_EQ(r.scale[0], 0x7E);           // NaN block amax: scale 448
  // So every decoded value is NaN, the canonical one (the GPU's bits): the NaN is not lost in
  // E2M1's finite codes.
  Tensor back(DType::kFloat32, Shape{16, 32});
  nvfp4_dequantize(q.view(), back);
  for (int64_t i = 0; i < back.numel(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(back.data_as<float>()[i]), 0x7FFFFFFFu) << i;
  for (DType wide : {DType::kBFloat16, DType::kFloat16}) {
    Tensor back16(wide, Shape{16, 32});
    nvfp4_dequantize(q.view(), back16);
    for (int64_t i = 0; i < back16.numel(); ++i)
      ASSERT_EQ(static_cast<const uint16_t*>(back16.data())[i], 0x7FFFu) << dtype_name(wide) << i;
  }
}

TEST(NvFp4Quantize, AnInfiniteTensorDecodesToNan) {
  Tensor x(DType::kFloat32, Shape{16, 16});
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = 1.0f;
  x.data_as<float>()[3] = -kInf;
  NvFp4Tensor q(Shape{16, 16}, Device::host(), true);
  nvfp4_quantize(x, q.view(), NvFp4Options{});
  EXPECT_TRUE(std::isnan(*q.scale_inv().data_as<float>()));
  EXPECT_TRUE(std::isnan(*q.scale_inv_t().data_as<float>()));
  expect_copy(reference(as_floats(x), 16, 16, false), q.data(), q.scale(), q.scale_inv(),
              "rowwise");
}

TEST(NvFp4Quantize, ShapesNotMultiplesOf16AreRefused) {
  Tensor x(DType::kFloat32, Shape{24, 32});
  EXPECT_QMESH_ERROR(NvFp4Tensor(Shape{24, 32}, Device::host(), false), "multiples of 16");
  NvFp4Tensor q(Shape{32, 32}, Device::host(), false);
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), NvFp4Options{}), "pad the tensor");
  Tensor x2(DType::kFloat32, Shape{32, 32});
  NvFp4Options o;
  o.rht = o.tiles_2d = true;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x2, q.view(), o), "turn one of rht and tiles_2d off");
  Tensor fp8(DType::kFloat8E4M3, Shape{32, 32});
  EXPECT_QMESH_ERROR(nvfp4_quantize(fp8, q.view(), NvFp4Options{}), "fp32, bf16 or fp16");
  Tensor small(DType::kFloat32, Shape{16, 32});
  EXPECT_QMESH_ERROR(nvfp4_dequantize(q.view(), small), "1024 elements");
  EXPECT_QMESH_ERROR(nvfp4_dequantize(q.view(), x2, true), "without a columnwise copy");
}

// Every element of a [rows, cols] tensor sits between two E2M1 values after scaling: the mean
// of its stochastically rounded values is the input's within 5 sigma, nearest-even is not.
TEST(NvFp4StochasticRounding, UnbiasedAndReproducible) {
  const int64_t rows = 256, cols = 1024;
  Tensor x(DType::kFloat32, Shape{rows, cols});
  auto* xv = x.data_as<float>();
  for (int64_t i = 0; i < x.numel(); ++i) xv[i] = i % 16 == 0 ? 6.0f : 2.6f;  // 2.6: p(up) 0.6
  NvFp4Options sr;
  sr.stochastic_rounding = true;
  sr.seed = 1234;
  auto mean_of = [&](const NvFp4Options& o, std::vector<uint8_t>* codes) {
    NvFp4Tensor q(Shape{rows, cols}, Device::host(), false);
    nvfp4_quantize(x, q.view(), o);
    Tensor out(DType::kFloat32, Shape{rows, cols});
    nvfp4_dequantize(q.view(), out);
    if (codes) *codes = bytes(q.data());
    double sum = 0;
    int64_t n = 0;
    for (int64_t i = 0; i < out.numel(); ++i)
      if (i % 16) sum += out.data_as<float>()[i], ++n;
    return sum / double(n);
  };
  const int64_t n = rows * cols * 15 / 16;
  const double sigma = std::sqrt(0.6 * 0.4 / double(n));  // step 1 (between 2 and 3)
  std::vector<uint8_t> a, b, c;
  const double mean = mean_of(sr, &a);
  EXPECT_NEAR(mean, 2.6, 5 * sigma);
  EXPECT_GT(std::fabs(mean_of(NvFp4Options{}, nullptr) - 2.6), 100 * sigma);  // RNE: 3
  mean_of(sr, &b);
  EXPECT_EQ(a, b);  // same seed, same bits
  sr.seed = 1235;
  mean_of(sr, &c);
  EXPECT_NE(a, c);
  std::printf("stochastic rounding of 2.6: mean %.6f over %lld elements (sigma %.2e)\n", mean,
              static_cast<long long>(n), sigma);
}

// A seed_key {k0, k1} rounds as the seed k0 << 32 | k1.
TEST(NvFp4StochasticRounding, SeedKeyIsTheSeed) {
  Tensor x = test::random_wide(DType::kFloat32, Shape{32, 32}, 4);
  Tensor key(DType::kInt32, Shape{2});
  key.data_as<int32_t>()[0] = 7;
  key.data_as<int32_t>()[1] = -3;
  NvFp4Options by_value, by_key;
  by_value.stochastic_rounding = by_key.stochastic_rounding = true;
  by_value.seed = (uint64_t{7} << 32) | uint32_t(-3);
  by_key.seed_key = key;
  NvFp4Tensor a(Shape{32, 32}, Device::host(), true), b(Shape{32, 32}, Device::host(), true);
  nvfp4_quantize(x, a.view(), by_value);
  nvfp4_quantize(x, b.view(), by_key);
  EXPECT_EQ(bytes(a.data()), bytes(b.data()));
  EXPECT_EQ(bytes(a.data_t()), bytes(b.data_t()));
  Tensor bad(DType::kFloat32, Shape{2});
  by_key.seed_key = bad;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, b.view(), by_key), "seed_key");
}

// The codes of stochastic rounding are exactly those of the documented rule: up iff the
// element's 32 random bits are below floor(fraction of a step * 2^32).
TEST(NvFp4StochasticRounding, FollowsTheDocumentedBits) {
  const int64_t rows = 16, cols = 64;
  Tensor x = test::random_wide(DType::kFloat32, Shape{rows, cols}, 11);
  NvFp4Tensor q(Shape{rows, cols}, Device::host(), true);
  NvFp4Options o;
  o.stochastic_rounding = true;
  o.seed = 99;
  nvfp4_quantize(x, q.view(), o);
  const std::vector<float> v = as_floats(x);
  for (int copy = 0; copy < 2; ++copy) {
    const std::vector<float> cv = copy ? transpose(v, rows, cols) : v;
    const int64_t r = copy ? cols : rows, cc = copy ? rows : cols;
    const CopyRef ref = reference(cv, r, cc, false);
    const std::vector<uint8_t> got = unpack(copy ? q.data_t() : q.data());
    for (int64_t i = 0; i < r * cc; ++i) {
      const float y = f32(double(cv[i]) * factor_ref(ref.scale[i / 16], ref.scale_inv));
      const double a = std::min(std::fabs(double(y)), 6.0);
      int k = 0;
      while (k < 7 && a >= kE2M1[k + 1]) ++k;
      const double frac = k == 7 ? 0.0 : (a - kE2M1[k]) / (kE2M1[k + 1] - kE2M1[k]);
      const uint32_t bits = rules::rounding_bits(o.seed, copy, uint64_t(i));
      const bool up = double(bits) < std::floor(std::ldexp(frac, 32));
      ASSERT_EQ(got[i], uint8_t((std::signbit(y) ? 8 : 0) | (k + (up ? 1 : 0))))
          << "copy " << copy << " element " << i;
    }
  }
}

TEST(NvFp4Hadamard, OrthogonalAndExactlyTheDocumentedSums) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> x(64), y(64), back(64);
  for (float& v : x) v = normal(rng);
  const uint16_t signs = nvfp4_rht_signs(42);
  nvfp4_hadamard16(x.data(), y.data(), 64, signs, false);
  nvfp4_hadamard16(y.data(), back.data(), 64, signs, true);
  double nx = 0, ny = 0;
  for (int i = 0; i < 64; ++i) {
    EXPECT_NEAR(back[i], x[i], 1e-5) << i;
    nx += double(x[i]) * x[i];
    ny += double(y[i]) * y[i];
  }
  EXPECT_NEAR(ny, nx, 1e-5 * nx);   // norm preserved
  for (int b = 0; b < 64; b += 16)  // against (1/4) H diag(d) x in float64
    for (int i = 0; i < 16; ++i) {
      double want = 0;
      for (int j = 0; j < 16; ++j) {
        const int h = std::popcount(unsigned(i & j)) % 2 ? -1 : 1;
        const int d = (signs >> j) & 1 ? -1 : 1;
        want += h * d * double(x[b + j]);
      }
      EXPECT_NEAR(y[b + i], want / 4, 1e-5) << i;
    }
  EXPECT_QMESH_ERROR(nvfp4_hadamard16(x.data(), y.data(), 10, signs, false), "multiple of 16");
}

// With RHT the columnwise copy is the quantized transform of x's transpose (by the rule, bit
// for bit); the rowwise copy is unchanged.
TEST(NvFp4Hadamard, ColumnwiseCopyIsTheQuantizedTransform) {
  const int64_t rows = 32, cols = 48;
  Tensor x = test::random_wide(DType::kBFloat16, Shape{rows, cols}, 21);
  NvFp4Tensor q(Shape{rows, cols}, Device::host(), true);
  NvFp4Options o;
  o.rht = true;
  o.rht_signs = 0xA5C3;
  nvfp4_quantize(x, q.view(), o);
  const std::vector<float> v = as_floats(x);
  std::vector<float> t = transpose(v, rows, cols), h(t.size());
  nvfp4_hadamard16(t.data(), h.data(), int64_t(t.size()), o.rht_signs, false);
  expect_copy(reference(v, rows, cols, false), q.data(), q.scale(), q.scale_inv(), "rowwise");
  expect_copy(reference(h, cols, rows, false), q.data_t(), q.scale_t(), q.scale_inv_t(),
              "columnwise");
}

// The columnwise copy with RHT holds the quantized transform of x's transpose: undoing the
// transform of its dequantization approximates x^T. Relative errors with and without RHT for
// an N(0, 1) tensor, with and without one outlier 1e6 (docs/design/nvfp4.md quotes them).
TEST(NvFp4Hadamard, QuantizedColumnwiseCopyAndItsError) {
  const int64_t rows = 256, cols = 256;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  Tensor x(DType::kFloat32, Shape{rows, cols});
  for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = normal(rng);
  auto error = [&](bool rht) {
    NvFp4Tensor q(Shape{rows, cols}, Device::host(), true);
    NvFp4Options o;
    o.rht = rht;
    o.rht_signs = nvfp4_rht_signs(7);
    nvfp4_quantize(x, q.view(), o);
    Tensor out(DType::kFloat32, Shape{cols, rows});
    nvfp4_dequantize(q.view(), out, true);
    std::vector<float> back(size_t(out.numel()));
    if (rht)
      nvfp4_hadamard16(out.data_as<float>(), back.data(), out.numel(), o.rht_signs, true);
    else
      std::copy(out.data_as<float>(), out.data_as<float>() + out.numel(), back.begin());
    const std::vector<float> xt = transpose(as_floats(x), rows, cols);
    double err = 0, norm = 0;
    for (size_t i = 0; i < xt.size(); ++i) {
      err += (double(back[i]) - xt[i]) * (double(back[i]) - xt[i]);
      norm += double(xt[i]) * xt[i];
    }
    return std::sqrt(err / norm);
  };
  const double gauss_plain = error(false), gauss_rht = error(true);
  EXPECT_LT(gauss_rht, 0.15);
  EXPECT_NEAR(gauss_rht / gauss_plain, 1.0, 0.1);
  x.data_as<float>()[5 * cols + 9] = 1.0e6f;
  const double outlier_plain = error(false), outlier_rht = error(true);
  EXPECT_LT(outlier_rht, 0.5 * outlier_plain);
  std::printf(
      "RHT error ratio: N(0,1) %.4f / %.4f = %.3f; with an outlier 1e6 %.3g / %.3g = %.3f\n",
      gauss_rht, gauss_plain, gauss_rht / gauss_plain, outlier_rht, outlier_plain,
      outlier_rht / outlier_plain);
}

TEST(NvFp4Options, RolesFollowTheRecipeSwitches) {
  const NvFp4Options w = nvfp4_options(NvFp4Config{}, NvFp4Role::kWeight, 1, 2);
  EXPECT_TRUE(w.tiles_2d);
  EXPECT_FALSE(w.rht || w.stochastic_rounding);
  const NvFp4Options g = nvfp4_options(NvFp4Config{}, NvFp4Role::kGradient, 1, 2);
  EXPECT_TRUE(g.stochastic_rounding && g.rht && !g.tiles_2d);
  EXPECT_EQ(g.rht_signs, nvfp4_rht_signs(2));
  const NvFp4Options i = nvfp4_options(NvFp4Config{}, NvFp4Role::kInput, 1, 2);
  EXPECT_TRUE(i.rht && !i.stochastic_rounding && !i.tiles_2d);
  const NvFp4Config off{true, true, true};
  const NvFp4Options g2 = nvfp4_options(off, NvFp4Role::kGradient, 1, 2);
  EXPECT_FALSE(g2.rht || g2.stochastic_rounding);
  EXPECT_FALSE(nvfp4_options(off, NvFp4Role::kWeight, 1, 2).tiles_2d);
}

// A given amax (the whole tensor's) makes each row shard of a 16x16-tiled tensor the slice of
// the whole tensor's quantization: the same codes, tile scales and per-tensor scale. Without
// it the shards' own amaxes give other scales. A given amax with the RHT's copy needs that
// copy's amax too (nvfp4_shard_test.cpp).
TEST(NvFp4Options, AGivenAmaxQuantizesAShardAsItsSliceOfTheWhole) {
  const int64_t rows = 32, cols = 48, half = rows / 2;
  Tensor x = test::random_wide(DType::kFloat32, Shape{rows, cols}, 8);
  float top = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) top = std::max(top, std::fabs(x.data_as<float>()[i]));
  x.data_as<float>()[5] = 2.0f * top;  // the whole tensor's amax, in the first shard
  NvFp4Options tiles;
  tiles.tiles_2d = true;
  NvFp4Tensor whole(Shape{rows, cols}, Device::host(), false);
  nvfp4_quantize(x.view(), whole.view(), tiles);
  Tensor amax(DType::kFloat32, Shape{1});
  *amax.data_as<float>() = 2.0f * top;
  for (int shard = 0; shard < 2; ++shard) {
    const TensorView part = x.view().slice(shard * half * cols, Shape{half, cols});
    NvFp4Tensor q(Shape{half, cols}, Device::host(), false);
    NvFp4Options given = tiles;
    given.amax = amax.view();
    nvfp4_quantize(part, q.view(), given);
    const auto bytes = [&](const Tensor& t, int64_t offset, int64_t n) {
      const auto* p = static_cast<const uint8_t*>(t.data()) + offset;
      return std::vector<uint8_t>(p, p + n);
    };
    EXPECT_EQ(bytes(q.data(), 0, q.data().nbytes()),
              bytes(whole.data(), shard * q.data().nbytes(), q.data().nbytes()));
    EXPECT_EQ(bytes(q.scale(), 0, q.scale().nbytes()),
              bytes(whole.scale(), shard * q.scale().nbytes(), q.scale().nbytes()));
    EXPECT_EQ(*q.scale_inv().data_as<float>(), *whole.scale_inv().data_as<float>());
    if (shard == 1) {  // its own amax is smaller: another per-tensor scale
      nvfp4_quantize(part, q.view(), tiles);
      EXPECT_NE(*q.scale_inv().data_as<float>(), *whole.scale_inv().data_as<float>());
    }
  }
  NvFp4Options rht;
  rht.rht = true;
  rht.amax = amax.view();
  NvFp4Tensor c(Shape{rows, cols}, Device::host(), true);
  EXPECT_QMESH_ERROR(nvfp4_quantize(x.view(), c.view(), rht), "give columnwise_amax");
}

}  // namespace
}  // namespace qmesh
