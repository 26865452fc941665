// Host backend of the cast ops against independent references: the scalar FP8 encoders
// (verified against CUDA for all 2^32 inputs), float64 sums and maxima, explicit transposes.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "qmesh/ops/amax.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/dbias_quantize.h"
#include "qmesh/ops/dequantize.h"
#include "qmesh/ops/grouped_quantize.h"
#include "qmesh/ops/quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

using test::decode_ref;
using test::encode_ref;
using test::random_wide;
using test::same_bits;
using test::wide_at;

double amax_ref(const TensorView& x) {
  double m = 0;
  for (int64_t i = 0; i < x.numel(); ++i) m = std::max(m, std::fabs(double(wide_at(x, i))));
  return m;
}

// (input dtype, FP8 dtype, rows, cols)
using CastParam = std::tuple<DType, DType, int64_t, int64_t>;

class CastTest : public ::testing::TestWithParam<CastParam> {
 protected:
  DType in() const { return std::get<0>(GetParam()); }
  DType fp8() const { return std::get<1>(GetParam()); }
  Shape shape() const { return Shape{std::get<2>(GetParam()), std::get<3>(GetParam())}; }
  int64_t rows() const { return std::get<2>(GetParam()); }
  int64_t cols() const { return std::get<3>(GetParam()); }
  // A scale that puts the largest inputs near the FP8 maximum, like delayed scaling does.
  float scale_for(const TensorView& x) const {
    const double a = amax_ref(x);
    return a > 0 ? static_cast<float>(fp8_max(fp8()) / a) : 1.0f;
  }
};

TEST_P(CastTest, QuantizeMatchesScalarEncoder) {
  const Tensor x = random_wide(in(), shape(), 1);
  QuantizedTensor q(fp8(), shape(), Device::host(), false);
  const QuantizedTensorView v = q.view();
  *v.scale = scale_for(x);
  quantize(x, v);
  const auto* codes = static_cast<const uint8_t*>(v.data.data);
  for (int64_t i = 0; i < x.numel(); ++i)
    ASSERT_EQ(codes[i], encode_ref(fp8(), wide_at(x, i) * *v.scale)) << "element " << i;
  EXPECT_TRUE(same_bits(*v.scale_inv, 1.0f / *v.scale));
  EXPECT_EQ(double(*v.amax), amax_ref(x));
}

TEST_P(CastTest, RoundTripWithinHalfUlp) {
  const Tensor x = random_wide(in(), shape(), 2);
  QuantizedTensor q(fp8(), shape(), Device::host(), false);
  const QuantizedTensorView v = q.view();
  *v.scale = scale_for(x);
  quantize(x, v);
  Tensor back(DType::kFloat32, shape());
  dequantize(v, back);
  // Round to nearest: relative error <= 2^-(mantissa bits + 1) in the normal range, absolute
  // error <= half the smallest subnormal below it (in scaled units).
  const bool e4m3 = fp8() == DType::kFloat8E4M3;
  const double rel = e4m3 ? std::ldexp(1.0, -4) : std::ldexp(1.0, -3);
  const double abs_scaled = e4m3 ? std::ldexp(1.0, -10) : std::ldexp(1.0, -17);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double ref = wide_at(x, i);
    const double got = back.data_as<float>()[i];
    const double bound = rel * std::fabs(ref) + abs_scaled / *v.scale;
    ASSERT_LE(std::fabs(got - ref), bound * (1 + 1e-6)) << "element " << i << " x=" << ref;
  }
}

TEST_P(CastTest, DequantizeToEachWideType) {
  const Tensor x = random_wide(in(), shape(), 3);
  QuantizedTensor q(fp8(), shape(), Device::host(), false);
  const QuantizedTensorView v = q.view();
  *v.scale = 3.0f;
  quantize(x, v);
  Tensor back(in(), shape());
  dequantize(v, back);
  const auto* codes = static_cast<const uint8_t*>(v.data.data);
  Tensor expected(in(), shape());
  for (int64_t i = 0; i < x.numel(); ++i)
    test::set_wide(expected, i, decode_ref(fp8(), codes[i]) * *v.scale_inv);
  EXPECT_EQ(std::memcmp(back.data(), expected.data(), back.nbytes()), 0);
}

TEST_P(CastTest, CastTransposeEqualsQuantizeThenTranspose) {
  const Tensor x = random_wide(in(), shape(), 4);
  QuantizedTensor rowwise(fp8(), shape(), Device::host(), false);
  QuantizedTensor both(fp8(), shape(), Device::host(), true);
  *rowwise.view().scale = *both.view().scale = scale_for(x);
  quantize(x, rowwise.view());
  cast_transpose(x, both.view());
  const auto* ref = static_cast<const uint8_t*>(rowwise.data().data());
  const auto* got = static_cast<const uint8_t*>(both.data().data());
  const auto* got_t = static_cast<const uint8_t*>(both.data_t().data());
  for (int64_t i = 0; i < rows(); ++i)
    for (int64_t j = 0; j < cols(); ++j) {
      ASSERT_EQ(got[i * cols() + j], ref[i * cols() + j]) << i << "," << j;
      ASSERT_EQ(got_t[j * rows() + i], ref[i * cols() + j]) << i << "," << j;
    }
  EXPECT_TRUE(same_bits(*both.view().amax, *rowwise.view().amax));
  EXPECT_TRUE(same_bits(*both.view().scale_inv, *rowwise.view().scale_inv));
}

TEST_P(CastTest, DbiasQuantizeSumsColumnsInFloat64Tolerance) {
  const Tensor g = random_wide(in(), shape(), 5);
  for (bool columnwise : {false, true}) {
    QuantizedTensor q(fp8(), shape(), Device::host(), columnwise);
    QuantizedTensor plain(fp8(), shape(), Device::host(), columnwise);
    *q.view().scale = *plain.view().scale = 2.0f;
    Tensor dbias(DType::kFloat32, Shape{cols()});
    dbias_quantize(g, q.view(), dbias);
    if (columnwise)
      cast_transpose(g, plain.view());
    else
      quantize(g, plain.view());
    EXPECT_EQ(std::memcmp(q.data().data(), plain.data().data(), q.data().nbytes()), 0);
    if (columnwise) {
      EXPECT_EQ(std::memcmp(q.data_t().data(), plain.data_t().data(), q.data_t().nbytes()), 0);
    }
    EXPECT_EQ(double(*q.view().amax), amax_ref(g));
    for (int64_t c = 0; c < cols(); ++c) {
      double sum = 0, sum_abs = 0;
      for (int64_t r = 0; r < rows(); ++r) {
        sum += wide_at(g, r * cols() + c);
        sum_abs += std::fabs(wide_at(g, r * cols() + c));
      }
      // fp32 accumulation of `rows` terms: error <= rows * 2^-24 * sum|g| (a loose bound).
      const double bound = double(rows()) * std::ldexp(1.0, -24) * sum_abs + 1e-30;
      ASSERT_NEAR(dbias.data_as<float>()[c], sum, bound) << "column " << c;
    }
  }
}

TEST_P(CastTest, AmaxMatchesFloat64) {
  const Tensor x = random_wide(in(), shape(), 6);
  Tensor out(DType::kFloat32, Shape{1});
  amax(x, out);
  EXPECT_EQ(double(out.data_as<float>()[0]), amax_ref(x));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CastTest,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                       ::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2),
                       ::testing::Values(1, 3, 64, 130, 513), ::testing::Values(1, 70, 256)),
    [](const ::testing::TestParamInfo<CastParam>& p) {
      return std::string(dtype_name(std::get<0>(p.param))) + "_" +
             std::string(dtype_name(std::get<1>(p.param))) + "_" +
             std::to_string(std::get<2>(p.param)) + "x" + std::to_string(std::get<3>(p.param));
    });

TEST(Amax, NanPropagatesAndInfinityWins) {
  std::vector<float> v = {1.0f, -7.0f, 2.0f, 0.5f};
  Tensor out(DType::kFloat32, Shape{1});
  const TensorView x(v.data(), DType::kFloat32, Shape{4});
  amax(x, out);
  EXPECT_EQ(out.data_as<float>()[0], 7.0f);
  v[2] = -std::numeric_limits<float>::infinity();
  amax(x, out);
  EXPECT_EQ(out.data_as<float>()[0], std::numeric_limits<float>::infinity());
  v[1] = std::numeric_limits<float>::quiet_NaN();
  amax(x, out);
  EXPECT_TRUE(std::isnan(out.data_as<float>()[0]));
}

// The quantizing ops keep a running max in *amax (micro-batches accumulate); the amax op
// replaces it.
TEST(CastOps, QuantizingOpsKeepARunningAmaxAndAmaxReplacesIt) {
  const std::vector<float> big = {1.0f, -6.0f, 2.0f, 0.5f}, small = {0.25f, -1.5f, 1.0f, 0.0f};
  const TensorView x_big(const_cast<float*>(big.data()), DType::kFloat32, Shape{2, 2});
  const TensorView x_small(const_cast<float*>(small.data()), DType::kFloat32, Shape{2, 2});
  std::vector<float> dbias(2);
  const TensorView dbias_view(dbias.data(), DType::kFloat32, Shape{2});
  using Op = std::function<void(const TensorView&, const QuantizedTensorView&)>;
  const std::pair<const char*, Op> ops[] = {
      {"quantize", [](const TensorView& x, const QuantizedTensorView& q) { quantize(x, q); }},
      {"cast_transpose",
       [](const TensorView& x, const QuantizedTensorView& q) { cast_transpose(x, q); }},
      {"dbias_quantize", [&](const TensorView& x,
                             const QuantizedTensorView& q) { dbias_quantize(x, q, dbias_view); }},
      {"grouped_quantize",
       [](const TensorView& x, const QuantizedTensorView& q) {
         grouped_quantize(x, {&q, 1});
       }},
  };
  for (const auto& [name, op] : ops) {
    QuantizedTensor q(DType::kFloat8E4M3, Shape{2, 2}, Device::host(), true);
    const QuantizedTensorView v = q.view();
    op(x_big, v);
    EXPECT_EQ(*v.amax, 6.0f) << name;
    op(x_small, v);  // a second micro-batch with a smaller amax does not lower it
    EXPECT_EQ(*v.amax, 6.0f) << name;
    *v.amax = 0.0f;  // reset, as the delayed-scaling update does to the history row
    op(x_small, v);
    EXPECT_EQ(*v.amax, 1.5f) << name;
  }
  float a = 100.0f;
  amax(x_small, TensorView(&a, DType::kFloat32, Shape{1}));
  EXPECT_EQ(a, 1.5f) << "amax replaces";
}

TEST(Quantize, SpecialValuesSaturateAndNanStaysNan) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {inf, -inf, 1e30f, -1e30f, std::numeric_limits<float>::quiet_NaN(), 0.0f};
  const TensorView x(v.data(), DType::kFloat32, Shape{1, 6});
  QuantizedTensor q(DType::kFloat8E4M3, Shape{1, 6}, Device::host(), false);
  quantize(x, q.view());
  const auto* c = static_cast<const uint8_t*>(q.data().data());
  EXPECT_EQ(c[0], 0x7E);  // +448
  EXPECT_EQ(c[1], 0xFE);  // -448
  EXPECT_EQ(c[2], 0x7E);
  EXPECT_EQ(c[3], 0xFE);
  EXPECT_EQ(c[4], 0x7F);  // NaN
  EXPECT_EQ(c[5], 0x00);
  EXPECT_TRUE(std::isnan(*q.view().amax));
}

// Groups with a columnwise copy (odd groups here) are cast_transpose'd, the others quantized.
TEST(GroupedQuantize, EqualsPerTensorQuantizeAndCastTranspose) {
  for (DType in : {DType::kFloat32, DType::kBFloat16}) {
    const std::vector<Shape> shapes = {Shape{3, 7},  Shape{1, 1},   Shape{300, 300},
                                       Shape{5, 16}, Shape{33, 70}, Shape{2, 3}};
    int64_t total = 0;
    for (const Shape& s : shapes) total += s.numel();
    const Tensor x = random_wide(in, Shape{total}, 7);
    std::vector<QuantizedTensor> grouped, single;
    std::vector<QuantizedTensorView> views;
    for (size_t g = 0; g < shapes.size(); ++g) {
      const bool columnwise = g % 2 == 1;
      grouped.emplace_back(DType::kFloat8E5M2, shapes[g], Device::host(), columnwise);
      single.emplace_back(DType::kFloat8E5M2, shapes[g], Device::host(), columnwise);
      *grouped.back().view().scale = *single.back().view().scale = 1.0f + float(g);
      views.push_back(grouped.back().view());
    }
    grouped_quantize(x, views);
    int64_t offset = 0;
    for (size_t g = 0; g < shapes.size(); ++g) {
      const TensorView part(static_cast<char*>(x.data()) + offset * dtype_size(in), in, shapes[g]);
      offset += shapes[g].numel();
      if (single[g].view().has_columnwise()) {
        cast_transpose(part, single[g].view());
        EXPECT_EQ(std::memcmp(grouped[g].view().data_t.data, single[g].view().data_t.data,
                              grouped[g].data().nbytes()),
                  0)
            << "group " << g << " columnwise";
      } else {
        quantize(part, single[g].view());
      }
      EXPECT_EQ(std::memcmp(grouped[g].data().data(), single[g].data().data(),
                            grouped[g].data().nbytes()),
                0)
          << "group " << g;
      EXPECT_TRUE(same_bits(*grouped[g].view().amax, *single[g].view().amax)) << "group " << g;
      EXPECT_TRUE(same_bits(*grouped[g].view().scale_inv, *single[g].view().scale_inv));
      EXPECT_EQ(double(*grouped[g].view().amax), amax_ref(part));
    }
  }
}

TEST(CastOps, BadInputsAreErrors) {
  Tensor x(DType::kFloat32, Shape{4, 8});
  Tensor ints(DType::kInt32, Shape{4, 8});
  QuantizedTensor q(DType::kFloat8E4M3, Shape{4, 8}, Device::host(), false);
  QuantizedTensor qt(DType::kFloat8E4M3, Shape{4, 8}, Device::host(), true);
  QuantizedTensor wrong(DType::kFloat8E4M3, Shape{8, 4}, Device::host(), true);
  EXPECT_QMESH_ERROR(quantize(ints, q.view()), "must be fp32, bf16 or fp16, got int32");
  EXPECT_QMESH_ERROR(quantize(x, wrong.view()), "must be a [8, 4] matrix");
  EXPECT_QMESH_ERROR(cast_transpose(x, q.view()), "has no columnwise copy");

  QuantizedTensorView not_fp8 = q.view();
  not_fp8.data = TensorView(x.data(), DType::kFloat32, Shape{4, 8});
  EXPECT_QMESH_ERROR(quantize(x, not_fp8), "must hold FP8 codes");

  QuantizedTensorView on_gpu = q.view();
  on_gpu.data.device = Device::cuda(0);
  EXPECT_QMESH_ERROR(quantize(x, on_gpu), "must be on host, got cuda:0");

  if (cuda_device_count() == 0) {
    const TensorView x_gpu(x.data(), DType::kFloat32, Shape{4, 8}, Device::cuda(0));
    EXPECT_QMESH_ERROR(quantize(x_gpu, on_gpu), "is not available");
  }

  QuantizedTensorView no_scale = q.view();
  no_scale.scale = nullptr;
  EXPECT_QMESH_ERROR(quantize(x, no_scale), "missing its scale");

  Tensor dbias(DType::kFloat32, Shape{4});
  EXPECT_QMESH_ERROR(dbias_quantize(x, qt.view(), dbias), "dbias must have shape [8]");
  Tensor dbias16(DType::kBFloat16, Shape{8});
  EXPECT_QMESH_ERROR(dbias_quantize(x, qt.view(), dbias16), "dbias must have dtype fp32");

  Tensor out2(DType::kFloat32, Shape{2});
  EXPECT_QMESH_ERROR(amax(x, out2), "one fp32 element");
  Tensor back(DType::kFloat32, Shape{5});
  EXPECT_QMESH_ERROR(dequantize(q.view(), back), "must have 32 elements");
  Tensor back8(DType::kFloat8E4M3, Shape{4, 8});
  EXPECT_QMESH_ERROR(dequantize(q.view(), back8), "must be fp32, bf16 or fp16");
}

TEST(GroupedQuantize, SizesMustAddUp) {
  Tensor x(DType::kFloat32, Shape{10});
  QuantizedTensor a(DType::kFloat8E4M3, Shape{4}, Device::host(), false);
  QuantizedTensor b(DType::kFloat8E4M3, Shape{4}, Device::host(), false);
  QuantizedTensor c(DType::kFloat8E4M3, Shape{4}, Device::host(), false);
  QuantizedTensor e5(DType::kFloat8E5M2, Shape{2}, Device::host(), false);
  const std::vector<QuantizedTensorView> short_groups = {a.view(), b.view()};
  EXPECT_QMESH_ERROR(grouped_quantize(x, short_groups), "must add up to the input size");
  const std::vector<QuantizedTensorView> long_groups = {a.view(), b.view(), c.view()};
  EXPECT_QMESH_ERROR(grouped_quantize(x, long_groups), "must add up to the input size");
  const std::vector<QuantizedTensorView> mixed = {a.view(), b.view(), e5.view()};
  EXPECT_QMESH_ERROR(grouped_quantize(x, mixed), "same FP8 format");
  EXPECT_QMESH_ERROR(grouped_quantize(x, std::span<const QuantizedTensorView>{}),
                     "at least one output group");
}

}  // namespace
}  // namespace qmesh
