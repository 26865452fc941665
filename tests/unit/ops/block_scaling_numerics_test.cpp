// What block scaling buys: a few outliers set a per-tensor scale that pushes every other
// value down towards (or into) FP8's subnormal range, while block scales confine that to the
// outliers' own blocks. The numbers printed here are quoted in docs/design/block_scaling.md.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/ops/dequantize.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/scaling/current_scaling.h"

namespace qmesh {
namespace {

const Shape kShape{1024, 1024};

// N(0, 1) values plus eight outliers `factor` times the largest of them.
Tensor with_outliers(double factor, double& rest_max) {
  Tensor x(DType::kFloat32, kShape);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  rest_max = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.data_as<float>()[i] = normal(rng);
    rest_max = std::max(rest_max, double(std::fabs(x.data_as<float>()[i])));
  }
  for (int64_t k = 0; k < 8; ++k)
    x.data_as<float>()[(k * 131 + 7) * kShape.cols() + k * 97] = float(factor * rest_max);
  return x;
}

// Errors of y against x over the non-zero elements that are not outliers (float64).
struct Errors {
  double l2 = 0.0;    // ||y - x||_2 / ||x||_2
  double mean = 0.0;  // mean of |y - x| / |x|
};

Errors errors(const Tensor& x, const Tensor& y, double rest_max) {
  double err = 0.0, norm = 0.0, rel = 0.0;
  int64_t n = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double a = x.data_as<float>()[i], b = y.data_as<float>()[i];
    if (a == 0.0 || std::fabs(a) > rest_max) continue;
    err += (b - a) * (b - a);
    norm += a * a;
    rel += std::fabs(b - a) / std::fabs(a);
    ++n;
  }
  return {std::sqrt(err / norm), rel / double(n)};
}

// Per-tensor current scaling (E4M3) and block scaling (E4M3, TE's default QParams) of the
// same tensor: {per-tensor errors, block errors}.
std::pair<Errors, Errors> measure(double factor, BlockShape block) {
  double rest_max = 0.0;
  const Tensor x = with_outliers(factor, rest_max);
  QuantizedTensor per_tensor(DType::kFloat8E4M3, kShape, Device::host(), false);
  quantize_current_scaling(x, per_tensor.view(), Float8CurrentScaling{Fp8Format::kE4M3});
  Tensor y_tensor(DType::kFloat32, kShape);
  dequantize(per_tensor.view(), y_tensor);
  BlockQuantizedTensor blocks(DType::kFloat8E4M3, kShape, block, Device::host(), false);
  block_quantize(x, blocks.view(), QParams{});
  Tensor y_block(DType::kFloat32, kShape);
  block_dequantize(blocks.view(), y_block);
  const Errors t = errors(x, y_tensor, rest_max), b = errors(x, y_block, rest_max);
  std::printf(
      "[ measured ] outliers %.0e, %s blocks: L2 error %.4f (per-tensor %.4f, ratio %.2f), "
      "mean relative error %.4f (per-tensor %.4f, ratio %.2f)\n",
      factor, block == BlockShape::k1x128 ? "1x128" : "128x128", b.l2, t.l2, t.l2 / b.l2, b.mean,
      t.mean, t.mean / b.mean);
  return {t, b};
}

// 1e3: E4M3's normal range (2^-6 .. 448, almost 15 binades) still holds the rest under the
// per-tensor scale: the L2 error is E4M3's rounding error either way, and only the small
// values (pushed into the subnormals) are better with blocks.
TEST(BlockScalingNumerics, OutliersAThousandTimesLargerCostSmallValues) {
  for (BlockShape block : {BlockShape::k1x128, BlockShape::k128x128}) {
    const auto [t, b] = measure(1e3, block);
    EXPECT_LT(b.l2, 1.05 * t.l2);
    EXPECT_LT(b.l2, 0.03) << "about E4M3's rounding error";
    if (block == BlockShape::k1x128) {
      EXPECT_GT(t.mean, 1.5 * b.mean);
    }
  }
}

// 1e5: under the per-tensor scale most of the rest falls into the subnormals or to zero;
// 1x128 blocks keep E4M3's rounding error everywhere but in the outliers' rows.
TEST(BlockScalingNumerics, OutliersBeyondTheNormalRangeNeedBlocks) {
  const auto [t, b] = measure(1e5, BlockShape::k1x128);
  EXPECT_GT(t.l2, 10 * b.l2);
  EXPECT_GT(t.mean, 20 * b.mean);
  const auto [tt, bt] = measure(1e5, BlockShape::k128x128);
  EXPECT_GT(tt.l2, 1.5 * bt.l2);
}

}  // namespace
}  // namespace qmesh
