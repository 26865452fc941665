// A shard of a tensor quantized with its origin and the whole tensor's amaxes (nvfp4_amax of
// every shard, reduced by max) is, bit for bit, the slice of the whole tensor's quantization:
// both copies, with stochastic rounding and the random Hadamard transform (docs/design/nvfp4.md
// "Sharding"). The reference is the unsharded cast; nvfp4_amax is checked against max |x| and
// the public transform nvfp4_hadamard16.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/ops/nvfp4_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

constexpr int64_t kRows = 64, kCols = 96;

// The [rows, cols] block of a row-major byte matrix with `width` bytes a row, at (r0, c0).
std::vector<uint8_t> block(const Tensor& t, int64_t width, int64_t r0, int64_t c0, int64_t rows,
                           int64_t cols) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  std::vector<uint8_t> out;
  for (int64_t i = r0; i < r0 + rows; ++i)
    out.insert(out.end(), p + i * width + c0, p + i * width + c0 + cols);
  return out;
}

std::vector<uint8_t> all(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data());
  return {p, p + t.nbytes()};
}

// x[r0 : r0 + rows, c0 : c0 + cols] as a contiguous fp32 tensor.
Tensor shard_of(const Tensor& x, int64_t r0, int64_t c0, int64_t rows, int64_t cols) {
  Tensor s(DType::kFloat32, Shape{rows, cols});
  for (int64_t i = 0; i < rows; ++i)
    std::memcpy(s.data_as<float>() + i * cols, x.data_as<float>() + (r0 + i) * kCols + c0,
                size_t(cols) * sizeof(float));
  return s;
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float e : v) m = std::max(m, std::fabs(e));
  return m;
}

// nvfp4_amax: max |x| and max |transform of the 16-blocks of x's columns| (the columnwise copy).
TEST(NvFp4Amax, IsTheCopiesOwnAmax) {
  Tensor x = test::random_wide(DType::kFloat32, Shape{kRows, kCols}, 5);
  std::vector<float> v(x.data_as<float>(), x.data_as<float>() + x.numel()), t(v.size()),
      h(v.size());
  for (int64_t i = 0; i < kRows; ++i)
    for (int64_t j = 0; j < kCols; ++j) t[j * kRows + i] = v[i * kCols + j];
  const uint16_t signs = nvfp4_rht_signs(9);
  nvfp4_hadamard16(t.data(), h.data(), int64_t(t.size()), signs, false);
  Tensor amax(DType::kFloat32, Shape{2});
  NvFp4Options o;
  nvfp4_amax(x, amax, o);
  EXPECT_EQ(amax.data_as<float>()[0], max_abs(v));
  EXPECT_EQ(amax.data_as<float>()[1], max_abs(v));
  o.rht = true;
  o.rht_signs = signs;
  nvfp4_amax(x, amax, o);
  EXPECT_EQ(amax.data_as<float>()[0], max_abs(v));
  EXPECT_EQ(amax.data_as<float>()[1], max_abs(h));
  EXPECT_NE(max_abs(h), max_abs(v));
  x.data_as<float>()[70] = std::nanf("");
  nvfp4_amax(x, amax, o);
  EXPECT_TRUE(std::isnan(amax.data_as<float>()[0]) && std::isnan(amax.data_as<float>()[1]));
  Tensor wrong(DType::kFloat32, Shape{1});
  EXPECT_QMESH_ERROR(nvfp4_amax(x, wrong, o), "rowwise and columnwise amaxes");
}

// (stochastic rounding, RHT, row shards, column shards)
using Param = std::tuple<bool, bool, int64_t, int64_t>;
class NvFp4Shard : public ::testing::TestWithParam<Param> {};

TEST_P(NvFp4Shard, QuantizesAsItsSliceOfTheWhole) {
  const auto [sr, rht, row_shards, col_shards] = GetParam();
  Tensor x = test::random_wide(DType::kFloat32, Shape{kRows, kCols}, 21);
  x.data_as<float>()[40 * kCols + 70] = 300.0f;  // the amax, in one shard only
  NvFp4Options o;
  o.stochastic_rounding = sr;
  o.seed = 77;
  o.rht = rht;
  o.rht_signs = nvfp4_rht_signs(4);
  NvFp4Tensor whole(Shape{kRows, kCols}, Device::host(), true);
  nvfp4_quantize(x, whole.view(), o);
  const int64_t rows = kRows / row_shards, cols = kCols / col_shards;
  // The whole tensor's amaxes: the shards' own, reduced by max.
  Tensor amax(DType::kFloat32, Shape{1}), columnwise_amax(DType::kFloat32, Shape{1});
  amax.data_as<float>()[0] = columnwise_amax.data_as<float>()[0] = 0.0f;
  for (int64_t r = 0; r < row_shards; ++r)
    for (int64_t c = 0; c < col_shards; ++c) {
      Tensor own(DType::kFloat32, Shape{2});
      nvfp4_amax(shard_of(x, r * rows, c * cols, rows, cols), own, o);
      amax.data_as<float>()[0] = std::max(amax.data_as<float>()[0], own.data_as<float>()[0]);
      columnwise_amax.data_as<float>()[0] =
          std::max(columnwise_amax.data_as<float>()[0], own.data_as<float>()[1]);
    }
  NvFp4Options given = o;
  given.amax = amax;
  if (rht) given.columnwise_amax = columnwise_amax;
  given.whole_rows = kRows;
  given.whole_cols = kCols;
  Tensor origin(DType::kInt32, Shape{2});
  given.origin = origin;
  for (int64_t r = 0; r < row_shards; ++r)
    for (int64_t c = 0; c < col_shards; ++c) {
      const int64_t r0 = r * rows, c0 = c * cols;
      origin.data_as<int32_t>()[0] = int32_t(r0);
      origin.data_as<int32_t>()[1] = int32_t(c0);
      const Tensor part = shard_of(x, r0, c0, rows, cols);
      NvFp4Tensor q(Shape{rows, cols}, Device::host(), true);
      nvfp4_quantize(part, q.view(), given);
      SCOPED_TRACE(testing::Message() << "shard at " << r0 << ", " << c0);
      EXPECT_EQ(all(q.data()), block(whole.data(), kCols / 2, r0, c0 / 2, rows, cols / 2));
      EXPECT_EQ(all(q.scale()), block(whole.scale(), kCols / 16, r0, c0 / 16, rows, cols / 16));
      EXPECT_EQ(all(q.scale_inv()), all(whole.scale_inv()));
      EXPECT_EQ(all(q.data_t()), block(whole.data_t(), kRows / 2, c0, r0 / 2, cols, rows / 2));
      EXPECT_EQ(all(q.scale_t()), block(whole.scale_t(), kRows / 16, c0, r0 / 16, cols, rows / 16));
      EXPECT_EQ(all(q.scale_inv_t()), all(whole.scale_inv_t()));
      if (sr && r0 + c0 > 0) {  // without its origin a shard draws the whole tensor's first bits
        NvFp4Options unplaced = o;
        unplaced.amax = given.amax;
        unplaced.columnwise_amax = given.columnwise_amax;
        nvfp4_quantize(part, q.view(), unplaced);
        EXPECT_NE(all(q.data()), block(whole.data(), kCols / 2, r0, c0 / 2, rows, cols / 2));
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Splits, NvFp4Shard,
                         ::testing::Values(Param{true, false, 2, 1}, Param{true, false, 1, 3},
                                           Param{true, false, 2, 2}, Param{false, true, 4, 1},
                                           Param{false, true, 1, 2}, Param{false, true, 2, 3},
                                           Param{true, true, 2, 1}, Param{true, true, 1, 3},
                                           Param{true, true, 4, 2}));

TEST(NvFp4Shard, BadOriginsAndAmaxesAreRefused) {
  Tensor x = test::random_wide(DType::kFloat32, Shape{32, 32}, 2);
  NvFp4Tensor q(Shape{32, 32}, Device::host(), true);
  Tensor origin(DType::kInt32, Shape{2}), amax(DType::kFloat32, Shape{1});
  amax.data_as<float>()[0] = 1.0f;
  NvFp4Options o;
  o.stochastic_rounding = true;
  o.origin = origin;
  o.whole_rows = 64;
  o.whole_cols = 48;
  const auto at = [&](int32_t r, int32_t c) {
    origin.data_as<int32_t>()[0] = r;
    origin.data_as<int32_t>()[1] = c;
  };
  at(32, 16);
  nvfp4_quantize(x, q.view(), o);  // the last shard fits
  at(48, 0);
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o),
                     "first row 48 must be a multiple of 16 in [0, 32]");
  at(0, 8);
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o), "first column 8 must be a multiple of 16");
  at(-16, 0);
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o), "first row -16");
  at(0, 0);
  o.whole_cols = 24;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o), "whole tensor");
  o.whole_cols = 16;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o), "larger than the whole tensor [64, 16]");
  o.whole_cols = 48;
  Tensor floats(DType::kFloat32, Shape{2}), three(DType::kInt32, Shape{3});
  o.origin = floats;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o), "origin");
  o.origin = three;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o), "first row and column");
  int32_t fake[2] = {0, 0};
  o.origin = TensorView(fake, DType::kInt32, Shape{2}, Device::cuda(0));
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o), "origin");
  o.origin = TensorView();
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), o), "given only with origin");
  NvFp4Options a;
  a.columnwise_amax = amax;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), a), "without rht or without that copy");
  a.rht = true;
  NvFp4Tensor rowwise(Shape{32, 32}, Device::host(), false);
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, rowwise.view(), a), "without rht or without that copy");
  a.columnwise_amax = TensorView();
  a.amax = amax;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), a), "give columnwise_amax");
  nvfp4_quantize(x, rowwise.view(), a);  // no transformed copy: amax alone
  a.columnwise_amax = origin;
  EXPECT_QMESH_ERROR(nvfp4_quantize(x, q.view(), a), "columnwise_amax");
}

}  // namespace
}  // namespace qmesh
