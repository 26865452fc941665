// grouped_mxfp8_quantize and grouped_nvfp4_quantize on the host: every group is bit for bit the
// non-grouped op on its own rows (stochastic rounding with nvfp4_group_seed, RHT), empty groups
// are skipped, and bad splits are clear errors.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "expect_error.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/ops/grouped_quantize.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "qmesh/ops/nvfp4_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

// Whether two host views hold the same bytes.
bool same_bytes(const TensorView& a, const TensorView& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

constexpr int64_t kCols = 64;
// Groups of whole 32-row blocks, one empty (also whole 16-row NVFP4 blocks).
const std::vector<int64_t> kSizes = {64, 0, 32, 96};

TEST(GroupedMxfp8Quantize, EachGroupIsMxfp8QuantizeOfItsRows) {
  const Tensor x = test::random_wide(DType::kBFloat16, Shape{192, kCols}, 11);
  std::vector<MxFp8Tensor> groups;
  std::vector<MxFp8TensorView> outs;
  for (int64_t rows : kSizes) {
    groups.emplace_back();
    if (rows > 0)
      groups.back() = MxFp8Tensor(DType::kFloat8E4M3, Shape{rows, kCols}, Device::host(), true);
    outs.push_back(rows > 0 ? groups.back().view() : MxFp8TensorView{});
  }
  grouped_mxfp8_quantize(x, outs, 1.0f);
  int64_t start = 0;
  for (size_t g = 0; g < kSizes.size(); ++g) {
    if (kSizes[g] == 0) continue;
    const MxFp8Tensor want(DType::kFloat8E4M3, Shape{kSizes[g], kCols}, Device::host(), true);
    mxfp8_quantize(x.view().rows(start, start + kSizes[g]), want.view(), 1.0f);
    const MxFp8TensorView got = outs[g], w = want.view();
    EXPECT_TRUE(same_bytes(got.data, w.data) && same_bytes(got.scale, w.scale)) << g;
    EXPECT_TRUE(same_bytes(got.data_t, w.data_t) && same_bytes(got.scale_t, w.scale_t)) << g;
    start += kSizes[g];
  }
}

TEST(GroupedNvfp4Quantize, EachGroupIsNvfp4QuantizeOfItsRowsWithItsSeed) {
  const Tensor x = test::random_wide(DType::kFloat32, Shape{192, kCols}, 12);
  NvFp4Options options;
  options.stochastic_rounding = true;
  options.seed = 0xFFFFFFFFFFFFFFF0ull;  // the group seeds wrap around 2^64
  options.rht = true;
  options.rht_signs = 0xA5C3;
  std::vector<NvFp4Tensor> groups;
  std::vector<NvFp4TensorView> outs;
  for (int64_t rows : kSizes) {
    groups.emplace_back();
    if (rows > 0) groups.back() = NvFp4Tensor(Shape{rows, kCols}, Device::host(), true);
    outs.push_back(rows > 0 ? groups.back().view() : NvFp4TensorView{});
  }
  grouped_nvfp4_quantize(x, outs, options);
  EXPECT_EQ(nvfp4_group_seed(options.seed, 0), options.seed);
  EXPECT_EQ(nvfp4_group_seed(5, 2), 5 + 2 * 0x9E3779B97F4A7C15ull);
  int64_t start = 0;
  for (size_t g = 0; g < kSizes.size(); ++g) {
    if (kSizes[g] == 0) continue;
    NvFp4Options own = options;
    own.seed = nvfp4_group_seed(options.seed, static_cast<int64_t>(g));
    const NvFp4Tensor want(Shape{kSizes[g], kCols}, Device::host(), true);
    nvfp4_quantize(x.view().rows(start, start + kSizes[g]), want.view(), own);
    const NvFp4Tensor& got = groups[g];
    for (auto part : {&NvFp4Tensor::data, &NvFp4Tensor::scale, &NvFp4Tensor::scale_inv,
                      &NvFp4Tensor::data_t, &NvFp4Tensor::scale_t, &NvFp4Tensor::scale_inv_t}) {
      EXPECT_TRUE(same_bytes((got.*part)().view(), (want.*part)().view())) << g;
    }
    // Another group's seed gives other bits: the seeds do differ per group.
    own.seed = nvfp4_group_seed(options.seed, static_cast<int64_t>(g) + 1);
    nvfp4_quantize(x.view().rows(start, start + kSizes[g]), want.view(), own);
    EXPECT_FALSE(same_bytes(got.data().view(), want.data().view())) << g;
    start += kSizes[g];
  }
}

TEST(GroupedScaledQuantize, BadSplitsAreClearErrors) {
  const Tensor x = test::random_wide(DType::kFloat32, Shape{64, kCols}, 13);
  const MxFp8Tensor mx32(DType::kFloat8E4M3, Shape{32, kCols}, Device::host(), false);
  MxFp8TensorView rows48 = mx32.view(), rows16 = mx32.view();
  rows48.data.shape = Shape{48, kCols};  // 48 + 16 rows: x's count, but not whole blocks
  rows16.data.shape = Shape{16, kCols};
  const MxFp8TensorView split[] = {rows48, rows16};
  EXPECT_QMESH_ERROR(grouped_mxfp8_quantize(x, split), "group 0 has 48 rows, not a multiple of 32");
  const MxFp8TensorView short_split[] = {mx32.view()};
  EXPECT_QMESH_ERROR(grouped_mxfp8_quantize(x, short_split), "hold 2048 elements but x [64, 64]");

  const NvFp4Tensor nv8(Shape{16, kCols}, Device::host(), false);
  NvFp4TensorView odd = nv8.view();
  odd.data.shape = Shape{8, kCols / 2};  // an 8-row group
  const NvFp4TensorView nv_split[] = {odd};
  EXPECT_QMESH_ERROR(grouped_nvfp4_quantize(x, nv_split, {}), "not a multiple of 16");
  NvFp4Options keyed;
  const Tensor key(DType::kInt32, Shape{2});
  keyed.seed_key = key.view();
  EXPECT_QMESH_ERROR(grouped_nvfp4_quantize(x, nv_split, keyed), "not options.seed_key");
  NvFp4Options placed;
  placed.origin = key.view();
  EXPECT_QMESH_ERROR(grouped_nvfp4_quantize(x, nv_split, placed), "leave options.amax");
}

}  // namespace
}  // namespace qmesh
