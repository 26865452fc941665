// block_quantize / block_dbias_quantize / block_dequantize / grouped_block_quantize against a
// reference computed here: float64 block amax, the scale rule of docs/numerics.md in float64
// (rounded once to fp32) and the FP8 encoding of qmesh/fp8.h (checked against CUDA's
// conversion for every fp32 input by numerics_exhaustive_test).
#include "qmesh/ops/block_quantize.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "expect_error.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/fp8.h"
#include "qmesh/ops/grouped_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// The expected codes and scale_inv tensor (padding 0) of a [rows, cols] row-major tensor.
struct Expected {
  std::vector<uint8_t> codes;
  std::vector<float> scale_inv;
};

double reference_scale(double amax, DType fp8, const QParams& q) {
  const double a = amax < q.amax_epsilon ? double(q.amax_epsilon) : amax;
  if (a == 0.0 || std::isinf(a) || std::isnan(a)) return 1.0;
  const double max = fp8 == DType::kFloat8E4M3 ? 448.0 : 57344.0;
  double s = static_cast<float>(max / a);  // one fp32 rounding of the quotient
  if (s > FLT_MAX) s = FLT_MAX;
  if (q.power_2_scale) s = std::exp2(std::floor(std::log2(s)));
  return s;
}

Expected reference(const std::vector<float>& x, int64_t rows, int64_t cols, BlockShape block,
                   DType fp8, const QParams& q) {
  const Shape ss = block_scale_shape(rows, cols, block);
  Expected e{std::vector<uint8_t>(x.size()), std::vector<float>(ss.numel(), 0.0f)};
  const int64_t bh = block == BlockShape::k1x128 ? 1 : 128;
  for (int64_t r0 = 0; r0 < rows; r0 += bh)
    for (int64_t c0 = 0; c0 < cols; c0 += 128) {
      const int64_t r1 = std::min(rows, r0 + bh), c1 = std::min(cols, c0 + 128);
      double amax = 0.0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const double a = std::fabs(double(x[r * cols + c]));
          amax = std::isnan(a) || std::isnan(amax) ? kNan : std::max(amax, a);
        }
      const double s = reference_scale(amax, fp8, q);
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c)
          e.codes[r * cols + c] =
              test::encode_ref(fp8, static_cast<float>(double(x[r * cols + c]) * s));
      const int64_t at = block == BlockShape::k1x128 ? (c0 / 128) * ss.cols() + r0
                                                     : (r0 / 128) * ss.cols() + c0 / 128;
      e.scale_inv[at] = static_cast<float>(1.0 / s);
    }
  return e;
}

template <class T>
std::vector<T> contents(const Tensor& t) {
  const T* p = static_cast<const T*>(t.data());
  return std::vector<T>(p, p + t.numel());
}

void expect_matches(const Tensor& codes, const Tensor& scale_inv, const Expected& e,
                    const char* what) {
  const auto c = contents<uint8_t>(codes);
  int64_t wrong = 0;
  for (size_t i = 0; i < c.size(); ++i) wrong += c[i] != e.codes[i];
  EXPECT_EQ(wrong, 0) << what << ": codes differing from the reference";
  const auto s = contents<float>(scale_inv);
  ASSERT_EQ(s.size(), e.scale_inv.size()) << what;
  for (size_t i = 0; i < s.size(); ++i)
    ASSERT_TRUE(test::same_bits(s[i], e.scale_inv[i]))
        << what << ": scale_inv[" << i << "] = " << s[i] << ", expected " << e.scale_inv[i];
}

// Quantizes x (host) with `block` and `q` into both layouts and checks them against the
// reference.
void check_against_reference(const Tensor& x, BlockShape block, DType fp8, const QParams& q,
                             bool columnwise) {
  const int64_t rows = x.shape().rows(), cols = x.shape().cols();
  BlockQuantizedTensor out(fp8, Shape{rows, cols}, block, Device::host(), columnwise);
  block_quantize(x, out.view(), q);
  const std::vector<float> v = test::widened(x);
  expect_matches(out.data(), out.scale_inv(), reference(v, rows, cols, block, fp8, q), "rowwise");
  if (columnwise)
    expect_matches(out.data_t(), out.scale_inv_t(),
                   reference(test::transposed(v, rows, cols), cols, rows, block, fp8, q),
                   "columnwise");
}

Tensor with_specials(DType dtype, const Shape& shape, uint32_t seed) {
  Tensor x = test::random_wide(dtype, shape, seed);
  // A few large values and exact zeros, so blocks differ in scale by many binades.
  for (int64_t i = 7; i < x.numel(); i += 1031) test::set_wide(x, i, i % 2 ? 3e4f : -1e-4f);
  return x;
}

TEST(BlockQuantize, MatchesFloat64ReferenceForEveryShapeAndOption) {
  const Shape shapes[] = {Shape{128, 128}, Shape{256, 384}, Shape{200, 300}, Shape{1, 5},
                          Shape{130, 1},   Shape{3, 257},   Shape{129, 131}};
  const QParams options[] = {QParams{true, 0.0f}, QParams{false, 0.0f}, QParams{false, 1e-2f},
                             QParams{true, 3.0f}};
  const DType inputs[] = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
  uint32_t seed = 1;
  for (const Shape& shape : shapes)
    for (DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2})
      for (BlockShape block : {BlockShape::k1x128, BlockShape::k128x128})
        for (const QParams& q : options) {
          const DType in = inputs[seed % std::size(inputs)];  // every input dtype in turn
          SCOPED_TRACE(testing::Message()
                       << shape.str() << " " << dtype_name(in) << " -> " << dtype_name(fp8)
                       << (block == BlockShape::k1x128 ? " 1x128" : " 128x128")
                       << " pow2=" << q.power_2_scale << " eps=" << q.amax_epsilon);
          const Tensor x = with_specials(in, shape, seed++);
          check_against_reference(x, block, fp8, q, /*columnwise=*/seed % 2 == 0);
        }
}

// One 1x128 block per row of a [rows, 128] tensor.
Tensor rows_of(std::vector<std::vector<float>> rows_values) {
  Tensor x(DType::kFloat32, Shape{int64_t(rows_values.size()), 128});
  for (size_t r = 0; r < rows_values.size(); ++r)
    for (int64_t c = 0; c < 128; ++c)
      x.data_as<float>()[r * 128 + c] = rows_values[r][size_t(c) % rows_values[r].size()];
  return x;
}

TEST(BlockQuantize, ScalesFollowTheCurrentScalingRulePerBlock) {
  // Row 0 amax 2 (plain scale 224; power of two 128), row 1 all zero (scale 1), row 2 amax 3.5.
  const Tensor x = rows_of({{2.0f, -1.0f}, {0.0f}, {-3.5f, 0.25f}});
  BlockQuantizedTensor plain(DType::kFloat8E4M3, Shape{3, 128}, BlockShape::k1x128, Device::host(),
                             false);
  block_quantize(x, plain.view(), QParams{false, 0.0f});
  const auto s = contents<float>(plain.scale_inv());
  ASSERT_EQ(s.size(), 4u);  // 3 rows padded to 4
  EXPECT_EQ(s[0], 1.0f / 224.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(s[2], 1.0f / 128.0f);
  EXPECT_EQ(s[3], 0.0f) << "padding stays 0";
  EXPECT_EQ(static_cast<const uint8_t*>(plain.data().data())[0], float_to_e4m3(448.0f));

  BlockQuantizedTensor pow2(DType::kFloat8E4M3, Shape{3, 128}, BlockShape::k1x128, Device::host(),
                            false);
  block_quantize(x, pow2.view(), QParams{true, 0.0f});
  const auto p = contents<float>(pow2.scale_inv());
  EXPECT_EQ(p[0], 1.0f / 128.0f);  // 224 rounded down
  EXPECT_EQ(p[1], 1.0f);
  EXPECT_EQ(p[2], 1.0f / 128.0f);  // 448 / 3.5 = 128 is a power of two already
}

TEST(BlockQuantize, EpsilonRaisesSmallAndZeroBlockAmaxes) {
  const Tensor x = rows_of({{0.0f}, {1e-6f}});
  BlockQuantizedTensor q(DType::kFloat8E4M3, Shape{2, 128}, BlockShape::k1x128, Device::host(),
                         false);
  block_quantize(x, q.view(), QParams{false, 1e-3f});
  const auto s = contents<float>(q.scale_inv());
  const float expected = 1.0f / static_cast<float>(448.0 / double(1e-3f));
  EXPECT_EQ(s[0], expected);
  EXPECT_EQ(s[1], expected);
}

// NaN and Inf follow per-tensor current scaling, block by block: a block whose amax is NaN or
// Inf gets scale 1 (NaN codes stay NaN, Inf saturates); the other blocks are unaffected.
TEST(BlockQuantize, NanAndInfOnlyAffectTheirOwnBlock) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor x = rows_of({{1.0f, nan}, {2.0f, kInf}, {2.0f, -1.0f}});
  BlockQuantizedTensor q(DType::kFloat8E4M3, Shape{3, 128}, BlockShape::k1x128, Device::host(),
                         true);
  block_quantize(x, q.view(), QParams{false, 0.0f});
  const auto s = contents<float>(q.scale_inv());
  EXPECT_EQ(s[0], 1.0f);
  EXPECT_EQ(s[1], 1.0f);
  EXPECT_EQ(s[2], 1.0f / 224.0f);
  const auto* c = static_cast<const uint8_t*>(q.data().data());
  EXPECT_EQ(c[0], float_to_e4m3(1.0f));
  EXPECT_EQ(c[1], 0x7F) << "NaN stays NaN";
  EXPECT_EQ(c[128 + 1], 0x7E) << "Inf saturates to 448";
  EXPECT_EQ(c[256], 0x7E) << "the clean block uses its own scale";
  // Columnwise: every 128x1 block holds the NaN or the Inf of its column (odd columns) or
  // only finite values (even columns).
  const auto st = contents<float>(q.scale_inv_t());
  EXPECT_EQ(st[1], 1.0f);
  EXPECT_EQ(st[0], 1.0f / 224.0f);
  BlockQuantizedTensor tiles(DType::kFloat8E4M3, Shape{3, 128}, BlockShape::k128x128,
                             Device::host(), false);
  block_quantize(x, tiles.view(), QParams{false, 0.0f});
  EXPECT_EQ(contents<float>(tiles.scale_inv())[0], 1.0f);
}

TEST(BlockDbiasQuantize, CodesAsBlockQuantizeAndColumnSumsInFloat64Tolerance) {
  for (BlockShape block : {BlockShape::k1x128, BlockShape::k128x128})
    for (const Shape& shape : {Shape{200, 300}, Shape{513, 129}, Shape{1, 7}}) {
      const Tensor g = test::random_wide(DType::kBFloat16, shape, 17);
      BlockQuantizedTensor a(DType::kFloat8E5M2, shape, block, Device::host(), true);
      BlockQuantizedTensor b(DType::kFloat8E5M2, shape, block, Device::host(), true);
      Tensor dbias(DType::kFloat32, Shape{shape.cols()});
      block_quantize(g, a.view(), QParams{});
      block_dbias_quantize(g, b.view(), dbias, QParams{});
      EXPECT_EQ(contents<uint8_t>(a.data()), contents<uint8_t>(b.data()));
      EXPECT_EQ(contents<uint8_t>(a.data_t()), contents<uint8_t>(b.data_t()));
      EXPECT_EQ(contents<float>(a.scale_inv()), contents<float>(b.scale_inv()));
      EXPECT_EQ(contents<float>(a.scale_inv_t()), contents<float>(b.scale_inv_t()));
      for (int64_t c = 0; c < shape.cols(); ++c) {
        double sum = 0.0, abs_sum = 0.0;
        for (int64_t r = 0; r < shape.rows(); ++r) {
          sum += test::wide_at(g, r * shape.cols() + c);
          abs_sum += std::fabs(test::wide_at(g, r * shape.cols() + c));
        }
        EXPECT_NEAR(dbias.data_as<float>()[c], sum, 1e-6 * abs_sum + 1e-30) << "column " << c;
      }
    }
}

TEST(BlockDequantize, DecodesEveryBlockWithItsScale) {
  for (BlockShape block : {BlockShape::k1x128, BlockShape::k128x128}) {
    const Shape shape{200, 300};
    const Tensor x = with_specials(DType::kFloat32, shape, 5);
    BlockQuantizedTensor q(DType::kFloat8E4M3, shape, block, Device::host(), false);
    block_quantize(x, q.view(), QParams{false, 0.0f});
    Tensor f32(DType::kFloat32, shape);
    Tensor bf16(DType::kBFloat16, shape);
    block_dequantize(q.view(), f32);
    block_dequantize(q.view(), bf16);
    const auto* codes = static_cast<const uint8_t*>(q.data().data());
    const auto scales = contents<float>(q.scale_inv());
    const int64_t ld = q.scale_inv().shape().cols();
    for (int64_t r = 0; r < shape.rows(); ++r)
      for (int64_t c = 0; c < shape.cols(); ++c) {
        const int64_t i = r * shape.cols() + c;
        const float s = block == BlockShape::k1x128 ? scales[(c / 128) * ld + r]
                                                    : scales[(r / 128) * ld + c / 128];
        const float expected = test::decode_ref(DType::kFloat8E4M3, codes[i]) * s;
        ASSERT_TRUE(test::same_bits(f32.data_as<float>()[i], expected)) << r << ", " << c;
        ASSERT_EQ(static_cast<const uint16_t*>(bf16.data())[i], float_to_bf16(expected));
        // And the round trip is within half an FP8 step of the block's scale.
        const double x_i = x.data_as<float>()[i];
        EXPECT_LE(std::fabs(f32.data_as<float>()[i] - x_i), std::fabs(x_i) / 16 + 1e-3 * s);
      }
  }
}

TEST(GroupedBlockQuantize, EachGroupIsBlockQuantizedOnItsOwnRows) {
  const int64_t cols = 300;
  const int64_t sizes[] = {130, 0, 3, 256};  // blocks of each group start at its first row
  const Tensor x = with_specials(DType::kBFloat16, Shape{389, cols}, 7);
  const std::vector<float> v = test::widened(x);
  for (BlockShape block : {BlockShape::k1x128, BlockShape::k128x128}) {
    SCOPED_TRACE(block == BlockShape::k1x128 ? "1x128" : "128x128");
    std::vector<BlockQuantizedTensor> groups;
    std::vector<BlockQuantizedTensorView> outs;
    for (int64_t rows : sizes) {
      if (rows == 0) {
        outs.emplace_back();  // an empty group: empty views
        continue;
      }
      groups.emplace_back(DType::kFloat8E4M3, Shape{rows, cols}, block, Device::host(), true);
      outs.push_back(groups.back().view());
    }
    grouped_block_quantize(x, outs, QParams{});
    int64_t start = 0, g = 0;
    for (int64_t rows : sizes) {
      if (rows == 0) continue;
      const std::vector<float> part(v.begin() + start * cols, v.begin() + (start + rows) * cols);
      const BlockQuantizedTensor& q = groups[g++];
      const QParams params{};
      expect_matches(q.data(), q.scale_inv(),
                     reference(part, rows, cols, block, DType::kFloat8E4M3, params), "rowwise");
      expect_matches(q.data_t(), q.scale_inv_t(),
                     reference(test::transposed(part, rows, cols), cols, rows, block,
                               DType::kFloat8E4M3, params),
                     "columnwise");
      start += rows;
    }
  }
  BlockQuantizedTensor one(DType::kFloat8E4M3, Shape{388, cols}, BlockShape::k1x128, Device::host(),
                           false);
  const BlockQuantizedTensorView short_outs[] = {one.view()};
  EXPECT_QMESH_ERROR(grouped_block_quantize(x, short_outs, QParams{}),
                     "hold 116400 elements but x [389, 300] has 116700");
}

TEST(BlockQuantize, BadArgumentsAreClearErrors) {
  Tensor x(DType::kFloat32, Shape{4, 8});
  Tensor ints(DType::kInt32, Shape{4, 8});
  BlockQuantizedTensor q(DType::kFloat8E4M3, Shape{4, 8}, BlockShape::k1x128, Device::host(), true);
  BlockQuantizedTensor wrong(DType::kFloat8E4M3, Shape{8, 4}, BlockShape::k1x128, Device::host(),
                             false);
  EXPECT_QMESH_ERROR(block_quantize(ints, q.view(), QParams{}), "must be fp32, bf16 or fp16");
  EXPECT_QMESH_ERROR(block_quantize(x, wrong.view(), QParams{}), "must be a [8, 4] matrix");
  EXPECT_QMESH_ERROR(block_quantize(x, q.view(), QParams{true, -1.0f}), "amax_epsilon");
  EXPECT_QMESH_ERROR(block_quantize(x, q.view(), QParams{true, kInf}), "amax_epsilon");

  BlockQuantizedTensorView not_fp8 = q.view();
  not_fp8.data = TensorView(x.data(), DType::kFloat32, Shape{4, 8});
  EXPECT_QMESH_ERROR(block_quantize(x, not_fp8, QParams{}), "must hold FP8 codes");

  BlockQuantizedTensorView bad_scales = q.view();
  bad_scales.scale_inv.shape = Shape{1, 8};  // [ceil(8/128), round_up(4, 4)] = [1, 4]
  EXPECT_QMESH_ERROR(block_quantize(x, bad_scales, QParams{}), "scale_inv");
  BlockQuantizedTensorView tile_scales = q.view();
  tile_scales.block = BlockShape::k128x128;  // its scales would be [1, 4] too, but data_t's
  tile_scales.scale_inv_t.shape = Shape{1, 8};
  EXPECT_QMESH_ERROR(block_quantize(x, tile_scales, QParams{}), "scale_inv");

  BlockQuantizedTensorView on_gpu = q.view();
  for (TensorView* t : {&on_gpu.data, &on_gpu.scale_inv, &on_gpu.data_t, &on_gpu.scale_inv_t})
    t->device = Device::cuda(0);
  EXPECT_QMESH_ERROR(block_quantize(x, on_gpu, QParams{}), "must be on host, got cuda:0");

  Tensor short_dbias(DType::kFloat32, Shape{7});
  EXPECT_QMESH_ERROR(block_dbias_quantize(x, q.view(), short_dbias, QParams{}), "dbias");
  Tensor dbias16(DType::kBFloat16, Shape{8});
  EXPECT_QMESH_ERROR(block_dbias_quantize(x, q.view(), dbias16, QParams{}), "dbias");

  Tensor small(DType::kFloat32, Shape{3, 8});
  EXPECT_QMESH_ERROR(block_dequantize(q.view(), small), "must have 32 elements");
  EXPECT_QMESH_ERROR(block_dequantize(q.view(), ints), "must be fp32, bf16 or fp16");
}

}  // namespace
}  // namespace qmesh
