// The E8M0 scale format of MXFP8 (qmesh/mxfp8_tensor.h): the decoder against ml_dtypes'
// float8_e8m0fnu for all 256 bytes, and the round-up scale rule of docs/design/mxfp8.md
// against a float64 reference (the smallest power of two >= amax / scaled_max).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "e8m0_ml_dtypes_table.h"
#include "qmesh/mxfp8_tensor.h"

namespace qmesh {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

TEST(E8M0, DecodesEveryByteLikeMlDtypes) {
  for (int b = 0; b < 256; ++b) {
    const float v = e8m0_to_float(static_cast<uint8_t>(b));
    if (b == 0xFF) {
      EXPECT_TRUE(std::isnan(v));
      EXPECT_TRUE(std::isnan(std::bit_cast<float>(kMlDtypesE8M0Bits[b])));
      continue;
    }
    EXPECT_EQ(std::bit_cast<uint32_t>(v), kMlDtypesE8M0Bits[b]) << "byte " << b;
    EXPECT_EQ(double(v), std::ldexp(1.0, b - 127)) << "byte " << b;
  }
}

// The byte of the smallest power of two >= q (q = fp32 quotient), clamped to [0, 254].
int reference_byte(float amax, float scaled_max) {
  const double q = double(amax / scaled_max);
  if (std::isnan(q)) return 0xFF;
  if (std::isinf(q)) return 0xFE;
  int e = -127;
  while (e < 127 && std::ldexp(1.0, e) < q) ++e;
  return e + 127;
}

TEST(E8M0, ScaleForAmaxRoundsTheQuotientUpToAPowerOfTwo) {
  const float maxes[] = {448.0f, 57344.0f, 448.0f / 8.0f};
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-149, 127);
  for (const float m : maxes) {
    // Every power of two, and its neighbours one ulp away.
    for (int e = -149; e <= 127; ++e) {
      const float p = std::ldexp(1.0f, e);
      for (const float a : {p, std::nextafter(p, 0.0f), std::nextafter(p, kInf)})
        EXPECT_EQ(int(e8m0_scale_for_amax(a, m)), reference_byte(a, m)) << a << " / " << m;
    }
    for (int i = 0; i < 20000; ++i) {
      const float a = std::ldexp(mant(rng), expo(rng));
      EXPECT_EQ(int(e8m0_scale_for_amax(a, m)), reference_byte(a, m)) << a << " / " << m;
    }
  }
}

TEST(E8M0, ScaleKeepsEveryElementOfTheBlockBelowTheMax) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::uniform_int_distribution<int> expo(-100, 100);
  for (int i = 0; i < 20000; ++i) {
    const float amax = std::ldexp(mant(rng), expo(rng));
    const uint8_t b = e8m0_scale_for_amax(amax, 448.0f);
    const double scaled = double(amax) / double(e8m0_to_float(b));
    EXPECT_LE(scaled, 448.0) << amax;
    EXPECT_GT(scaled, 448.0 / 2.0 * (1.0 - 1e-6)) << amax;  // the smallest such power
  }
}

TEST(E8M0, SpecialAmaxes) {
  EXPECT_EQ(e8m0_scale_for_amax(0.0f, 448.0f), 0);      // a zero block: the smallest scale
  EXPECT_EQ(e8m0_scale_for_amax(kNan, 448.0f), 0xFF);   // NaN propagates into the scale
  EXPECT_EQ(e8m0_scale_for_amax(kInf, 448.0f), 0xFE);   // the largest finite scale
  EXPECT_EQ(e8m0_scale_for_amax(448.0f, 448.0f), 127);  // exactly the max: scale 1
  EXPECT_EQ(e8m0_scale_for_amax(449.0f, 448.0f), 128);
}

}  // namespace
}  // namespace qmesh
