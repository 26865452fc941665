// bf16 and fp16 conversions: edge cases against their IEEE-style definitions, and a round
// trip of every 16-bit code.
#include "qmesh/float16.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <vector>

namespace qmesh {
namespace {

TEST(BFloat16, EveryCodeRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_float(uint16_t(h));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
    if (!std::isnan(f))
      EXPECT_EQ(float_to_bf16(f), h) << h;
    else
      EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(f)))) << h;
  }
}

TEST(BFloat16, RoundsToNearestEvenAndOverflowsToInf) {
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6: rounds up to even.
  EXPECT_EQ(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);
  EXPECT_EQ(float_to_bf16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3F81);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7F80);  // inf
  EXPECT_EQ(float_to_bf16(-std::numeric_limits<float>::infinity()), 0xFF80);
  // A NaN whose payload lives only in the low bits must stay NaN, not become inf.
  const float nan_low = std::bit_cast<float>(0x7F800001u);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(nan_low))));
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
}

TEST(Float16, EveryCodeRoundTripsThroughFloat) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = fp16_to_float(uint16_t(h));
    const int exp = (h >> 10) & 0x1F, man = h & 0x3FF;
    double want;
    if (exp == 0x1F)
      want = man ? std::nan("") : std::numeric_limits<double>::infinity();
    else if (exp == 0)
      want = std::ldexp(man, -24);
    else
      want = std::ldexp(1.0 + man / 1024.0, exp - 15);
    if (h & 0x8000) want = -want;
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE(std::isnan(fp16_to_float(float_to_fp16(f)))) << h;
    } else {
      EXPECT_EQ(double(f), want) << h;
      EXPECT_EQ(float_to_fp16(f), h) << h;
    }
  }
}

TEST(Float16, OverflowUnderflowAndTies) {
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7BFF);
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7C00);  // midpoint rounds to even: inf
  EXPECT_EQ(float_to_fp16(1e10f), 0x7C00);
  EXPECT_EQ(float_to_fp16(std::ldexp(1.0f, -25)), 0x0000);  // half of min subnormal: tie to 0
  EXPECT_EQ(float_to_fp16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(float_to_fp16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp ties to even 2
}

TEST(Float16, ArrayVersionsEqualScalar) {
  std::vector<float> x(999);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i)) * std::exp2(float(i % 40) - 20);
  std::vector<uint16_t> b(x.size()), h(x.size());
  std::vector<float> bb(x.size()), hh(x.size());
  fp32_to_bf16(x.data(), b.data(), x.size());
  fp32_to_fp16(x.data(), h.data(), x.size());
  bf16_to_fp32(b.data(), bb.data(), x.size());
  fp16_to_fp32(h.data(), hh.data(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_EQ(b[i], float_to_bf16(x[i]));
    ASSERT_EQ(h[i], float_to_fp16(x[i]));
    ASSERT_EQ(bb[i], bf16_to_float(b[i]));
    ASSERT_EQ(hh[i], fp16_to_float(h[i]));
  }
}

}  // namespace
}  // namespace qmesh
