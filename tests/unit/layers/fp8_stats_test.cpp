// Fp8Stats against values worked out by hand from the OCP FP8 formats: E4M3's largest finite
// value is 448 (saturating casts clip to it), its smallest subnormal 2^-9; E5M2's are 57344
// and 2^-16.
#include "qmesh/layers/fp8_stats.h"

#include <gtest/gtest.h>

#include <cmath>

#include "qmesh/error.h"
#include "qmesh/ops/quantize.h"

namespace qmesh {
namespace {

QuantizedTensor quantized(const Tensor& x, DType fp8, float scale) {
  QuantizedTensor q(fp8, x.shape(), Device::host(), false);
  QuantizedTensorView v = q.view();
  *v.scale = scale;
  *v.scale_inv = 1.0f / scale;
  quantize(x, v);
  return q;
}

TEST(Fp8Stats, CountsSaturatedAndFlushedValuesAndMeasuresTheError) {
  // scale 1: 1000 clips to 448; 2^-12 is below half of E4M3's smallest subnormal (2^-9) and
  // flushes to 0; 0 is not counted as flushed; 1 and 2 are exact.
  const float values[] = {1000.0f, std::ldexp(1.0f, -12), 0.0f, 1.0f, -2.0f, 1.0f};
  Tensor x(DType::kFloat32, Shape{2, 3});
  std::copy(values, values + 6, x.data_as<float>());
  QuantizedTensor q = quantized(x, DType::kFloat8E4M3, 1.0f);
  Fp8Stats stats;
  const int id = stats.add(OperandRole::kInput);
  stats.record(id, x, q.view(), 0.0f);
  const Fp8OperandStats& s = stats.operands()[0];
  EXPECT_EQ(s.casts, 1);
  EXPECT_EQ(s.values, 6);
  EXPECT_EQ(s.saturated, 1);
  EXPECT_EQ(s.flushed, 1);
  const double tiny = std::ldexp(1.0, -12);
  EXPECT_DOUBLE_EQ(s.error_sq, (1000.0 - 448.0) * (1000.0 - 448.0) + tiny * tiny);
  EXPECT_DOUBLE_EQ(s.value_sq, 1000.0 * 1000.0 + tiny * tiny + 1 + 4 + 1);
  EXPECT_DOUBLE_EQ(s.rel_error_last, std::sqrt(s.error_sq / s.value_sq));
  // amax 1000 against the 448 the scale stands for.
  EXPECT_DOUBLE_EQ(s.staleness_max, 1000.0 / 448.0);
}

TEST(Fp8Stats, StalenessIsTheAmaxOverTheAmaxOfTheScaleWithItsMargin) {
  // A delayed scale computed from amax 8 with margin 1: (57344 / 8) / 2. A tensor of amax 2
  // uses a quarter of it; a second one of amax 16 twice.
  Fp8Stats stats;
  const int id = stats.add(OperandRole::kGradOutput);
  const float scale = 57344.0f / 8.0f / 2.0f;
  for (float amax : {2.0f, 16.0f}) {
    Tensor x(DType::kFloat32, Shape{1, 2});
    x.data_as<float>()[0] = -amax;
    x.data_as<float>()[1] = amax / 4;
    QuantizedTensor q = quantized(x, DType::kFloat8E5M2, scale);
    stats.record(id, x, q.view(), 1.0f);
  }
  const Fp8OperandStats& s = stats.operands()[0];
  EXPECT_EQ(s.casts, 2);
  EXPECT_DOUBLE_EQ(s.staleness_min, 0.25);
  EXPECT_DOUBLE_EQ(s.staleness_max, 2.0);
  EXPECT_DOUBLE_EQ(s.staleness_sum, 2.25);
  EXPECT_DOUBLE_EQ(s.staleness_last, 2.0);
  EXPECT_EQ(s.saturated, 0);  // 16 * scale = 57344: the largest value, exact
  EXPECT_NE(stats.report().find("grad_output"), std::string::npos);
}

TEST(Fp8Stats, RejectsAnUnknownOperand) {
  Fp8Stats stats;
  Tensor x(DType::kFloat32, Shape{1, 1});
  QuantizedTensor q = quantized(x, DType::kFloat8E4M3, 1.0f);
  EXPECT_THROW(stats.record(0, x, q.view(), 0.0f), Error);
}

}  // namespace
}  // namespace qmesh
