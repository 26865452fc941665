// activation_bound (src/ops/cast_activation.h, internal), which lets the CUDA amax pass skip
// the activation of elements that cannot raise the maximum: it bounds |activate(x, pre)| for
// every bf16 and fp16 value, for fp32 values sampled over all bit patterns and for the
// specials, and it is tight (|x| for GELU) where the pass needs it to skip.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/cast_activation.h"
#include "qmesh/float16.h"

namespace qmesh::detail {
namespace {

// Every bf16 and fp16 value, and fp32 bit patterns in steps of 32771 (about 131 K values,
// every exponent), as floats.
std::vector<float> probe_values() {
  std::vector<float> v;
  for (uint32_t h = 0; h <= 0xFFFFu; ++h) {
    v.push_back(bf16_to_float(static_cast<uint16_t>(h)));
    v.push_back(fp16_to_float(static_cast<uint16_t>(h)));
  }
  for (uint64_t b = 0; b <= 0xFFFFFFFFu; b += 32771) v.push_back(std::bit_cast<float>(uint32_t(b)));
  return v;
}

TEST(ActivationBound, BoundsGelu) {
  for (float x : probe_values()) {
    const uint32_t bound = activation_bound<CastActivation::kGelu>(x, 0.0f);
    ASSERT_LE(abs_bits(activate<CastActivation::kGelu>(x, 0.0f)), bound) << "x " << x;
    // Tight where it matters: |x| itself for normal finite x from 2^-124 up.
    if (std::isfinite(x) && std::fabs(x) >= 0x1p-124f) {
      ASSERT_EQ(bound, abs_bits(x)) << x;
    }
  }
}

TEST(ActivationBound, BoundsGeluBackward) {
  constexpr float kMax = std::numeric_limits<float>::max();
  const float xs[] = {-3.5f, 0x1p-149f, 7e-39f, kMax};
  for (float pre : probe_values()) {
    if (!std::isfinite(pre) || std::fabs(pre) > 0x1p32f) {
      EXPECT_EQ(activation_bound<CastActivation::kDgelu>(1.0f, pre), 0xFFFFFFFFu) << pre;
      continue;
    }
    // The property the bound rests on: |gelu'(pre)| <= 1.13 (< 1.25).
    ASSERT_LE(std::fabs(dgelu(pre)), 1.13f) << "pre " << pre;
    for (float x : xs) {
      ASSERT_LE(abs_bits(activate<CastActivation::kDgelu>(x, pre)),
                activation_bound<CastActivation::kDgelu>(x, pre))
          << "x " << x << " pre " << pre;
    }
  }
  EXPECT_EQ(activation_bound<CastActivation::kDgelu>(2.0f, 1.0f), abs_bits(2.5f));
}

TEST(ActivationBound, NoBoundWhereTheActivationCanBeNan) {
  constexpr float kInf = std::numeric_limits<float>::infinity();
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  // gelu(-inf) and inf · gelu'(-20) = inf · 0 are NaN, above every finite or infinite bound.
  EXPECT_TRUE(std::isnan(activate<CastActivation::kGelu>(-kInf, 0.0f)));
  EXPECT_TRUE(std::isnan(activate<CastActivation::kDgelu>(kInf, -20.0f)));
  // Past 2^32 gelu' overflows into inf · 0: NaN from finite inputs.
  EXPECT_TRUE(std::isnan(activate<CastActivation::kDgelu>(1.0f, 1e30f)));
  for (float x : {kInf, -kInf, kNan}) {
    EXPECT_EQ(activation_bound<CastActivation::kGelu>(x, 0.0f), 0xFFFFFFFFu) << x;
    EXPECT_EQ(activation_bound<CastActivation::kDgelu>(x, 1.0f), 0xFFFFFFFFu) << x;
    EXPECT_EQ(activation_bound<CastActivation::kDgelu>(1.0f, x), 0xFFFFFFFFu) << x;
  }
  EXPECT_EQ(activation_bound<CastActivation::kDgelu>(1.0f, 0x1p33f), 0xFFFFFFFFu);
  EXPECT_EQ(activation_bound<CastActivation::kNone>(-kInf, 0.0f), abs_bits(kInf));
}

}  // namespace
}  // namespace qmesh::detail
