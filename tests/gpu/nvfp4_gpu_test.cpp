// CUDA NVFP4 casts (cuda/nvfp4_cast.cu) against their host twin (cpu/nvfp4_cast.cpp): codes,
// scales and per-tensor scales must be bit-identical in both copies for every option (stochastic
// rounding with the same seed, from a value or a device key, RHT, 16x16 tiles), and so must
// dequantization. Skips without a GPU.
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
  EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data()));
  EXPECT_EQ(bytes_of(d.scale()), bytes_of(h.scale()));
  EXPECT_EQ(bytes_of(d.scale_inv()), bytes_of(h.scale_inv()));
  EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t()));
  EXPECT_EQ(bytes_of(d.scale_t()), bytes_of(h.scale_t()));
  EXPECT_EQ(bytes_of(d.scale_inv_t()), bytes_of(h.scale_inv_t()));
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

}  // namespace
}  // namespace qmesh
