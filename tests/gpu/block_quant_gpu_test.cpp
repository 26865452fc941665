// CUDA block-scaled casts (cuda/block_cast.cu) against their host twin (cpu/block_cast.cpp):
// codes, scale_inv and dbias must be bit-identical, in both layouts, for aligned, unaligned and
// ragged tensors. Skips without a GPU.
#include <gtest/gtest.h>

#include <limits>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "gpu_cast_test_util.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/buffer.h"
#include "qmesh/copy.h"
#include "qmesh/ops/block_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

const Device kGpu = Device::cuda(0);

void expect_same(const BlockQuantizedTensor& d, const BlockQuantizedTensor& h) {
  EXPECT_EQ(test::bytes_of(d.data()), test::bytes_of(h.data())) << "rowwise codes";
  EXPECT_EQ(test::bytes_of(d.scale_inv()), test::bytes_of(h.scale_inv())) << "rowwise scale_inv";
  if (!h.has_columnwise()) return;
  EXPECT_EQ(test::bytes_of(d.data_t()), test::bytes_of(h.data_t())) << "columnwise codes";
  EXPECT_EQ(test::bytes_of(d.scale_inv_t()), test::bytes_of(h.scale_inv_t()))
      << "columnwise scale_inv";
}

using Param = std::tuple<DType, DType, int64_t, int64_t>;
class BlockCastGpuTest : public ::testing::TestWithParam<Param> {
 protected:
  DType in() const { return std::get<0>(GetParam()); }
  DType fp8() const { return std::get<1>(GetParam()); }
  Shape shape() const { return Shape{std::get<2>(GetParam()), std::get<3>(GetParam())}; }
};

TEST_P(BlockCastGpuTest, QuantizeAndDbiasMatchHostBitwise) {
  SKIP_WITHOUT_GPU();
  const Tensor x = test::special_input(in(), shape(), 7, /*nonfinite=*/false);
  Tensor dx(x.dtype(), x.shape(), kGpu);
  copy_tensor(dx, x);
  const QParams options[] = {QParams{}, QParams{false, 0.0f}, QParams{false, 0.5f}};
  for (BlockShape block : {BlockShape::k1x128, BlockShape::k128x128})
    for (bool columnwise : {false, true})
      for (const QParams& q : options) {
        SCOPED_TRACE(testing::Message()
                     << (block == BlockShape::k1x128 ? "1x128" : "128x128")
                     << " columnwise=" << columnwise << " pow2=" << q.power_2_scale);
        BlockQuantizedTensor h(fp8(), shape(), block, Device::host(), columnwise);
        BlockQuantizedTensor d(fp8(), shape(), block, kGpu, columnwise);
        block_quantize(x, h.view(), q);
        block_quantize(dx, d.view(), q);
        expect_same(d, h);
        Tensor hb(DType::kFloat32, Shape{shape().cols()});
        Tensor db(DType::kFloat32, Shape{shape().cols()}, kGpu);
        block_dbias_quantize(x, h.view(), hb, q);
        block_dbias_quantize(dx, d.view(), db, q);
        expect_same(d, h);
        EXPECT_EQ(test::bytes_of(db), test::bytes_of(hb)) << "dbias";
        for (DType out : {DType::kFloat32, DType::kBFloat16}) {
          Tensor hy(out, shape()), dy(out, shape(), kGpu);
          block_dequantize(h.view(), hy);
          block_dequantize(d.view(), dy);
          EXPECT_EQ(test::bytes_of(dy), test::bytes_of(hy)) << "dequantized to " << dtype_name(out);
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Shapes, BlockCastGpuTest,
                         ::testing::Values(Param{DType::kBFloat16, DType::kFloat8E4M3, 256, 512},
                                           Param{DType::kFloat32, DType::kFloat8E4M3, 384, 256},
                                           Param{DType::kFloat16, DType::kFloat8E5M2, 128, 128},
                                           Param{DType::kFloat32, DType::kFloat8E5M2, 200, 300},
                                           Param{DType::kBFloat16, DType::kFloat8E4M3, 1, 1},
                                           Param{DType::kBFloat16, DType::kFloat8E5M2, 131, 129},
                                           Param{DType::kFloat32, DType::kFloat8E4M3, 1000, 24},
                                           Param{DType::kBFloat16, DType::kFloat8E4M3, 24, 1000},
                                           Param{DType::kFloat16, DType::kFloat8E4M3, 2048, 1536}));

TEST(BlockCastGpu, NanAndInfMatchHostBitwise) {
  SKIP_WITHOUT_GPU();
  const Shape shape{300, 520};
  const Tensor x = test::special_input(DType::kBFloat16, shape, 9, /*nonfinite=*/true);
  Tensor dx(x.dtype(), shape, kGpu);
  copy_tensor(dx, x);
  for (BlockShape block : {BlockShape::k1x128, BlockShape::k128x128}) {
    BlockQuantizedTensor h(DType::kFloat8E4M3, shape, block, Device::host(), true);
    BlockQuantizedTensor d(DType::kFloat8E4M3, shape, block, kGpu, true);
    block_quantize(x, h.view(), QParams{});
    block_quantize(dx, d.view(), QParams{});
    expect_same(d, h);
  }
}

// An input one element past an aligned address takes the element-wise loads.
TEST(BlockCastGpu, UnalignedInputMatchesHostBitwise) {
  SKIP_WITHOUT_GPU();
  const Shape shape{256, 384};
  const Tensor x = test::special_input(DType::kFloat32, Shape{shape.numel() + 1}, 5, false);
  Tensor dx(DType::kFloat32, x.shape(), kGpu);
  copy_tensor(dx, x);
  const TensorView hv(static_cast<float*>(x.data()) + 1, DType::kFloat32, shape);
  const TensorView dv(static_cast<float*>(dx.data()) + 1, DType::kFloat32, shape, kGpu);
  BlockQuantizedTensor h(DType::kFloat8E4M3, shape, BlockShape::k1x128, Device::host(), true);
  BlockQuantizedTensor d(DType::kFloat8E4M3, shape, BlockShape::k1x128, kGpu, true);
  block_quantize(hv, h.view(), QParams{});
  block_quantize(dv, d.view(), QParams{});
  expect_same(d, h);
}

TEST(BlockCastGpu, HostInputWithGpuOutputIsAnError) {
  SKIP_WITHOUT_GPU();
  const Tensor x(DType::kFloat32, Shape{4, 8});
  BlockQuantizedTensor d(DType::kFloat8E4M3, Shape{4, 8}, BlockShape::k1x128, kGpu, false);
  EXPECT_QMESH_ERROR(block_quantize(x, d.view(), QParams{}), "must be on host, got cuda:0");
}

}  // namespace
}  // namespace qmesh
