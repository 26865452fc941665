// CUDA NVFP4 casts (cuda/nvfp4_cast.cu) against their host twin (cpu/nvfp4_cast.cpp): codes,
// scales and per-tensor scales must be bit-identical in both copies for every option (stochastic
// rounding with the same seed, from a value or a device key, RHT, 16x16 tiles; a shard with its
// device origin and given amaxes), and so must dequantization and nvfp4_amax. Skips without a
// GPU.
#include <gtest/gtest.h>

#include <limits>
#include <tuple>
#include <vector>

#include "qmesh/buffer.h"
#include "qmesh/copy.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/ops/nvfp4_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

const Device kGpu = Device::cuda(0);

std::vector<uint8_t> bytes_of(const TensorView& t) {
  std::vector<uint8_t> out(t.nbytes());
  copy_bytes(out.data(), Device::host(), t.data, t.device, t.nbytes());
  return out;
}

Tensor on(const Device& device, const Tensor& host) {
  Tensor t(host.dtype(), host.shape(), device);
  copy_bytes(t.data(), device, host.data(), Device::host(), host.nbytes());
  return t;
}

// Both copies of two NVFP4 tensors hold the same bytes.
void expect_same_bytes(const NvFp4Tensor& d, const NvFp4Tensor& h) {
  EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data()));
  EXPECT_EQ(bytes_of(d.scale()), bytes_of(h.scale()));
  EXPECT_EQ(bytes_of(d.scale_inv()), bytes_of(h.scale_inv()));
  EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t()));
  EXPECT_EQ(bytes_of(d.scale_t()), bytes_of(h.scale_t()));
  EXPECT_EQ(bytes_of(d.scale_inv_t()), bytes_of(h.scale_inv_t()));
}

// (input dtype, rows, cols, stochastic rounding, RHT, 16x16 tiles)
using Param = std::tuple<DType, int64_t, int64_t, bool, bool, bool>;
class NvFp4GpuTest : public ::testing::TestWithParam<Param> {};

TEST_P(NvFp4GpuTest, MatchesTheHostTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const auto [dtype, rows, cols, sr, rht, tiles] = GetParam();
  Tensor x = test::random_wide(dtype, Shape{rows, cols}, 17);
  test::set_wide(x, 5, 3e4f);
  test::set_wide(x, 77, std::numeric_limits<float>::quiet_NaN());
  Tensor key(DType::kInt32, Shape{2});
  key.data_as<int32_t>()[0] = 11;
  key.data_as<int32_t>()[1] = -5;
  NvFp4Options o;
  o.stochastic_rounding = sr;
  o.rht = rht;
  o.rht_signs = nvfp4_rht_signs(3);
  o.tiles_2d = tiles;
  NvFp4Options host_o = o, gpu_o = o;
  const Tensor gpu_key = on(kGpu, key);
  host_o.seed_key = key;
  gpu_o.seed_key = gpu_key;
  NvFp4Tensor h(Shape{rows, cols}, Device::host(), true), d(Shape{rows, cols}, kGpu, true);
  nvfp4_quantize(x, h.view(), host_o);
  const Tensor xd = on(kGpu, x);
  nvfp4_quantize(xd, d.view(), gpu_o);
  expect_same_bytes(d, h);
  for (bool columnwise : {false, true}) {
    const Shape shape = columnwise ? Shape{cols, rows} : Shape{rows, cols};
    Tensor out_h(dtype, shape), out_d(dtype, shape, kGpu);
    nvfp4_dequantize(h.view(), out_h, columnwise);
    nvfp4_dequantize(d.view(), out_d, columnwise);
    EXPECT_EQ(bytes_of(out_d), bytes_of(out_h)) << "columnwise " << columnwise;
  }
}

INSTANTIATE_TEST_SUITE_P(Options, NvFp4GpuTest,
                         ::testing::Values(Param{DType::kFloat32, 64, 96, false, false, false},
                                           Param{DType::kBFloat16, 128, 256, true, false, false},
                                           Param{DType::kFloat16, 48, 32, true, true, false},
                                           Param{DType::kBFloat16, 256, 512, false, true, false},
                                           Param{DType::kFloat32, 64, 128, false, false, true},
                                           Param{DType::kBFloat16, 1024, 2048, true, true, false}));

// A shard cast at its origin (a device tensor, read by the kernel) with the whole tensor's amaxes,
// stochastic rounding and RHT, and nvfp4_amax with and without RHT, as on the host.
TEST(NvFp4GpuShard, MatchesTheHostTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const int64_t rows = 32, cols = 64;
  Tensor x = test::random_wide(DType::kBFloat16, Shape{rows, cols}, 23);
  const Tensor xd = on(kGpu, x);
  NvFp4Options o;
  o.stochastic_rounding = true;
  o.seed = 99;
  o.rht_signs = nvfp4_rht_signs(8);
  Tensor amax_h(DType::kFloat32, Shape{2}), amax_d(DType::kFloat32, Shape{2}, kGpu);
  for (bool rht : {false, true}) {
    o.rht = rht;
    nvfp4_amax(x, amax_h, o);
    nvfp4_amax(xd, amax_d, o);
    EXPECT_EQ(bytes_of(amax_d), bytes_of(amax_h)) << "rht " << rht;
  }
  Tensor origin(DType::kInt32, Shape{2}), whole_amax(DType::kFloat32, Shape{2});
  origin.data_as<int32_t>()[0] = 48;
  origin.data_as<int32_t>()[1] = 32;
  whole_amax.data_as<float>()[0] = 2.0f * amax_h.data_as<float>()[0];
  whole_amax.data_as<float>()[1] = 3.0f * amax_h.data_as<float>()[1];
  const Tensor origin_d = on(kGpu, origin), whole_amax_d = on(kGpu, whole_amax);
  NvFp4Options host_o = o, gpu_o = o;
  host_o.whole_rows = gpu_o.whole_rows = 128;
  host_o.whole_cols = gpu_o.whole_cols = 96;
  host_o.origin = origin;
  host_o.amax = whole_amax.view().slice(0, Shape{1});
  host_o.columnwise_amax = whole_amax.view().slice(1, Shape{1});
  gpu_o.origin = origin_d;
  gpu_o.amax = whole_amax_d.view().slice(0, Shape{1});
  gpu_o.columnwise_amax = whole_amax_d.view().slice(1, Shape{1});
  NvFp4Tensor h(Shape{rows, cols}, Device::host(), true), d(Shape{rows, cols}, kGpu, true);
  nvfp4_quantize(x, h.view(), host_o);
  nvfp4_quantize(xd, d.view(), gpu_o);
  expect_same_bytes(d, h);
}

}  // namespace
}  // namespace qmesh
