// mxfp8_quantize / mxfp8_dbias_quantize / mxfp8_dequantize against a reference computed here:
// float64 block amax, the E8M0 byte as the smallest power of two >= amax / scaled_max (float64
// search over the fp32 quotient), codes = the FP8 encoding (qmesh/fp8.h, checked against CUDA
// for every fp32 input by numerics_exhaustive_test) of x * 2^(127 - byte) computed in float64.
#include "qmesh/ops/mxfp8_quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "expect_error.h"
#include "qmesh/fp8.h"
#include "qmesh/mxfp8_tensor.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

template <class T>
std::vector<T> host_vector(const TensorView& t) {
  const T* p = static_cast<const T*>(t.data);
  return std::vector<T>(p, p + t.numel());
}

int reference_byte(double amax, double scaled_max) {
  if (std::isnan(amax)) return 0xFF;
  const double q = double(static_cast<float>(amax) / static_cast<float>(scaled_max));
  if (std::isinf(q)) return 0xFE;
  int e = -127;
  while (e < 127 && std::ldexp(1.0, e) < q) ++e;
  return e + 127;
}

// Codes and scales of the 1x32 blocks of a row-major [rows, cols] tensor.
struct Expected {
  std::vector<uint8_t> codes, scale;
};

Expected reference(const std::vector<float>& x, int64_t rows, int64_t cols, DType fp8,
                   double margin) {
  Expected e{std::vector<uint8_t>(x.size()), std::vector<uint8_t>(x.size() / 32)};
  const double scaled_max = double(fp8_max(fp8)) / std::exp2(margin);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c0 = 0; c0 < cols; c0 += 32) {
      double amax = 0.0;
      for (int64_t c = c0; c < c0 + 32; ++c) {
        const double a = std::fabs(double(x[r * cols + c]));
        amax = std::isnan(a) || std::isnan(amax) ? std::nan("") : std::max(amax, a);
      }
      const int byte = reference_byte(amax, scaled_max);
      const double s = byte == 0xFF ? 1.0 : std::ldexp(1.0, 127 - byte);
      for (int64_t c = c0; c < c0 + 32; ++c)
        e.codes[r * cols + c] = test::encode_ref(fp8, static_cast<float>(x[r * cols + c] * s));
      e.scale[r * (cols / 32) + c0 / 32] = static_cast<uint8_t>(byte);
    }
  return e;
}

void expect_matches(const MxFp8Tensor& q, const std::vector<float>& x, int64_t rows, int64_t cols,
                    double margin) {
  const MxFp8TensorView v = q.view();
  const Expected row = reference(x, rows, cols, q.dtype(), margin);
  EXPECT_EQ(host_vector<uint8_t>(v.data), row.codes) << "rowwise codes";
  EXPECT_EQ(host_vector<uint8_t>(v.scale), row.scale) << "rowwise scales";
  if (!q.has_columnwise()) return;
  const Expected col = reference(test::transposed(x, rows, cols), cols, rows, q.dtype(), margin);
  EXPECT_EQ(host_vector<uint8_t>(v.data_t), col.codes) << "columnwise codes";
  EXPECT_EQ(host_vector<uint8_t>(v.scale_t), col.scale) << "columnwise scales";
}

TEST(Mxfp8Quantize, MatchesFloat64ReferenceForEveryDtypeAndFormat) {
  for (const DType in : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (const DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2})
      for (const bool columnwise : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(in)) + " -> " + std::string(dtype_name(fp8)));
        const int64_t rows = 96, cols = 160;
        const Tensor x = test::random_wide(in, Shape{rows, cols}, 5);
        MxFp8Tensor q(fp8, Shape{rows, cols}, Device::host(), columnwise);
        mxfp8_quantize(x.view(), q.view());
        expect_matches(q, test::widened(x), rows, cols, 0.0);
      }
}

TEST(Mxfp8Quantize, MarginLowersTheLargestCodeByItsPowerOfTwo) {
  const Tensor x = test::random_wide(DType::kFloat32, Shape{32, 64}, 9);
  MxFp8Tensor q(DType::kFloat8E4M3, Shape{32, 64}, Device::host(), true);
  mxfp8_quantize(x.view(), q.view(), 2.0f);
  expect_matches(q, test::widened(x), 32, 64, 2.0);
  for (const uint8_t code : host_vector<uint8_t>(q.view().data))
    EXPECT_LE(std::fabs(e4m3_to_float(code)), 448.0f / 4.0f);
  EXPECT_QMESH_ERROR(mxfp8_quantize(x.view(), q.view(), -1.0f), "margin must be finite and >= 0");
}

TEST(Mxfp8Quantize, ZeroNanAndInfBlocks) {
  // Row 0: zeros; row 1: a NaN in its first block; row 2: +inf and -inf in its first block.
  Tensor x(DType::kFloat32, Shape{32, 64});
  std::vector<float> v(32 * 64, 0.0f);
  for (size_t i = 64; i < v.size(); ++i) v[i] = 0.25f * float(i % 7) - 0.5f;
  v[64 + 3] = kNan;
  v[128 + 1] = kInf;
  v[128 + 2] = -kInf;
  std::copy(v.begin(), v.end(), static_cast<float*>(x.data()));
  MxFp8Tensor q(DType::kFloat8E4M3, Shape{32, 64}, Device::host(), true);
  mxfp8_quantize(x.view(), q.view());
  expect_matches(q, v, 32, 64, 0.0);
  const auto scale = host_vector<uint8_t>(q.view().scale);
  EXPECT_EQ(scale[0], 0);     // zero block: the smallest scale, all codes 0
  EXPECT_EQ(scale[2], 0xFF);  // NaN block
  EXPECT_EQ(scale[4], 0xFE);  // inf block: the largest scale
  EXPECT_NE(scale[3], 0xFF);  // the NaN's row: its other block is unaffected
  Tensor back(DType::kFloat32, Shape{32, 64});
  mxfp8_dequantize(q.view(), back.view());
  const auto d = host_vector<float>(back.view());
  for (int64_t c = 0; c < 64; ++c) EXPECT_EQ(d[c], 0.0f);
  for (int64_t c = 64; c < 96; ++c) EXPECT_TRUE(std::isnan(d[c])) << c;
  EXPECT_EQ(d[128 + 1], kInf);   // +-inf survive the round trip
  EXPECT_EQ(d[128 + 2], -kInf);  // (448 * 2^127 overflows fp32)
  EXPECT_EQ(d[128 + 0], 0.0f);   // the finite elements of the inf block underflow to 0
}

TEST(Mxfp8Quantize, DequantizeIsCodeTimesTheScale) {
  const int64_t rows = 64, cols = 96;
  const Tensor x = test::random_wide(DType::kFloat32, Shape{rows, cols}, 3);
  MxFp8Tensor q(DType::kFloat8E5M2, Shape{rows, cols}, Device::host(), false);
  mxfp8_quantize(x.view(), q.view());
  const auto codes = host_vector<uint8_t>(q.view().data);
  const auto scale = host_vector<uint8_t>(q.view().scale);
  for (const DType out : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    Tensor y(out, Shape{rows, cols});
    mxfp8_dequantize(q.view(), y.view());
    for (int64_t i = 0; i < rows * cols; ++i) {
      const double want = double(test::decode_ref(DType::kFloat8E5M2, codes[i])) *
                          std::ldexp(1.0, int(scale[i / 32]) - 127);
      Tensor one(out, Shape{1});
      test::set_wide(one, 0, static_cast<float>(want));
      ASSERT_TRUE(test::same_bits(test::wide_at(y, i), test::wide_at(one, 0))) << i;
    }
  }
  // Quantization error of a block: at most half a code step of its largest binade.
  const auto xv = test::widened(x);
  Tensor y(DType::kFloat32, Shape{rows, cols});
  mxfp8_dequantize(q.view(), y.view());
  for (int64_t i = 0; i < rows * cols; ++i)
    EXPECT_LE(std::fabs(double(test::wide_at(y, i)) - xv[i]),
              std::ldexp(1.0, int(scale[i / 32]) - 127) * 4096.0 + 1e-30)
        << i;
}

TEST(Mxfp8Quantize, DbiasIsTheColumnSum) {
  const int64_t rows = 96, cols = 64;
  const Tensor g = test::random_wide(DType::kBFloat16, Shape{rows, cols}, 4);
  MxFp8Tensor q(DType::kFloat8E5M2, Shape{rows, cols}, Device::host(), true);
  Tensor dbias(DType::kFloat32, Shape{cols});
  mxfp8_dbias_quantize(g.view(), q.view(), dbias.view());
  const auto gv = test::widened(g);
  expect_matches(q, gv, rows, cols, 0.0);
  for (int64_t c = 0; c < cols; ++c) {
    double sum = 0.0, mag = 0.0;
    for (int64_t r = 0; r < rows; ++r) {
      sum += gv[r * cols + c];
      mag += std::fabs(gv[r * cols + c]);
    }
    EXPECT_NEAR(test::wide_at(dbias, c), sum, mag * 1e-6) << c;
  }
}

TEST(Mxfp8Quantize, RefusesSizesThatAreNotMultiplesOf32AndBadArguments) {
  EXPECT_QMESH_ERROR(MxFp8Tensor(DType::kFloat8E4M3, Shape{33, 64}, Device::host(), false),
                     "positive multiples of 32");
  EXPECT_QMESH_ERROR(MxFp8Tensor(DType::kFloat8E4M3, Shape{32, 40}, Device::host(), true),
                     "pad the tensor");
  EXPECT_QMESH_ERROR(MxFp8Tensor(DType::kFloat32, Shape{32, 32}, Device::host(), true),
                     "needs an FP8 dtype");
  MxFp8Tensor q(DType::kFloat8E4M3, Shape{32, 64}, Device::host(), false);
  const Tensor wrong(DType::kFloat32, Shape{32, 32});
  EXPECT_QMESH_ERROR(mxfp8_quantize(wrong.view(), q.view()), "input must be a [32, 64] matrix");
  const Tensor ints(DType::kInt32, Shape{32, 64});
  EXPECT_QMESH_ERROR(mxfp8_quantize(ints.view(), q.view()), "must be fp32, bf16 or fp16");
  MxFp8TensorView bad = q.view();
  bad.scale = TensorView(bad.scale.data, DType::kFloat8E4M3, bad.scale.shape, bad.scale.device);
  const Tensor x(DType::kFloat32, Shape{32, 64});
  EXPECT_QMESH_ERROR(mxfp8_quantize(x.view(), bad), "scale");
  Tensor dbias(DType::kFloat32, Shape{63});
  EXPECT_QMESH_ERROR(mxfp8_dbias_quantize(x.view(), q.view(), dbias.view()), "dbias");
}

}  // namespace
}  // namespace qmesh
