// grouped_mxfp8_quantize and grouped_nvfp4_quantize on CUDA against the host (the same ops on
// host buffers): every part of every group bit-identical, stochastic rounding's per-group
// seeds and RHT included. Skips without a GPU.
#include <gtest/gtest.h>

#include <vector>

#include "qmesh/copy.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/ops/grouped_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

const Device kGpu = Device::cuda(0);
const std::vector<int64_t> kSizes = {64, 0, 32, 160};  // whole 32-row blocks, one group empty

std::vector<uint8_t> bytes_of(const TensorView& t) {
  std::vector<uint8_t> out(t.nbytes());
  if (!t.empty()) copy_bytes(out.data(), Device::host(), t.data, t.device, t.nbytes());
  return out;
}

Tensor on(const Device& device, const Tensor& host) {
  Tensor t(host.dtype(), host.shape(), device);
  copy_bytes(t.data(), device, host.data(), Device::host(), host.nbytes());
  return t;
}

// One output per group of kSizes on `device` (default-constructed for an empty group), made
// by make(rows, device), and their views.
template <class Owned, class View, class Make>
std::vector<View> group_outputs(std::vector<Owned>& owned, const Device& device, Make&& make) {
  std::vector<View> views;
  for (int64_t rows : kSizes) {
    owned.push_back(rows > 0 ? make(rows, device) : Owned{});
    views.push_back(rows > 0 ? owned.back().view() : View{});
  }
  return views;
}

TEST(GroupedScaledGpu, Mxfp8MatchesTheHost) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Tensor x = test::random_wide(DType::kBFloat16, Shape{256, 96}, 21);
  const auto make = [](int64_t rows, const Device& d) {
    return MxFp8Tensor(DType::kFloat8E4M3, Shape{rows, 96}, d, true);
  };
  std::vector<MxFp8Tensor> host, gpu;
  const auto h = group_outputs<MxFp8Tensor, MxFp8TensorView>(host, Device::host(), make);
  const auto d = group_outputs<MxFp8Tensor, MxFp8TensorView>(gpu, kGpu, make);
  grouped_mxfp8_quantize(x, h, 0.0f);
  const Tensor xd = on(kGpu, x);
  grouped_mxfp8_quantize(xd, d, 0.0f);
  for (size_t g = 0; g < kSizes.size(); ++g) {
    EXPECT_EQ(bytes_of(d[g].data), bytes_of(h[g].data)) << g;
    EXPECT_EQ(bytes_of(d[g].scale), bytes_of(h[g].scale)) << g;
    EXPECT_EQ(bytes_of(d[g].data_t), bytes_of(h[g].data_t)) << g;
    EXPECT_EQ(bytes_of(d[g].scale_t), bytes_of(h[g].scale_t)) << g;
  }
}

TEST(GroupedScaledGpu, Nvfp4WithStochasticRoundingAndRhtMatchesTheHost) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Tensor x = test::random_wide(DType::kFloat32, Shape{256, 96}, 22);
  const auto make = [](int64_t rows, const Device& d) {
    return NvFp4Tensor(Shape{rows, 96}, d, true);
  };
  std::vector<NvFp4Tensor> host, gpu;
  const auto h = group_outputs<NvFp4Tensor, NvFp4TensorView>(host, Device::host(), make);
  const auto d = group_outputs<NvFp4Tensor, NvFp4TensorView>(gpu, kGpu, make);
  NvFp4Options options;
  options.stochastic_rounding = true;
  options.seed = 0x1234567890ABCDEFull;
  options.rht = true;
  options.rht_signs = nvfp4_rht_signs(9);
  grouped_nvfp4_quantize(x, h, options);
  const Tensor xd = on(kGpu, x);
  grouped_nvfp4_quantize(xd, d, options);
  for (size_t g = 0; g < kSizes.size(); ++g) {
    EXPECT_EQ(bytes_of(d[g].data), bytes_of(h[g].data)) << g;
    EXPECT_EQ(bytes_of(d[g].scale), bytes_of(h[g].scale)) << g;
    EXPECT_EQ(bytes_of(d[g].scale_inv), bytes_of(h[g].scale_inv)) << g;
    EXPECT_EQ(bytes_of(d[g].data_t), bytes_of(h[g].data_t)) << g;
    EXPECT_EQ(bytes_of(d[g].scale_t), bytes_of(h[g].scale_t)) << g;
    EXPECT_EQ(bytes_of(d[g].scale_inv_t), bytes_of(h[g].scale_inv_t)) << g;
  }
}

}  // namespace
}  // namespace qmesh
