// CUDA MXFP8 casts (cuda/mxfp8_cast.cu) against their host twin (cpu/mxfp8_cast.cpp): codes,
// E8M0 scales, dbias and dequantized values must be bit-identical in both layouts, with NaN
// and Inf blocks and margins; and the emulated MXFP8 GEMM on CUDA (bf16 operands) against the
// host's. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <tuple>
#include <vector>

#include "gpu_cast_test_util.h"
#include "qmesh/copy.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

const Device kGpu = Device::cuda(0);

void expect_same(const MxFp8TensorView& d, const MxFp8TensorView& h) {
  EXPECT_EQ(test::bytes_of(d.data), test::bytes_of(h.data)) << "rowwise codes";
  EXPECT_EQ(test::bytes_of(d.scale), test::bytes_of(h.scale)) << "rowwise scales";
  if (!h.has_columnwise()) return;
  EXPECT_EQ(test::bytes_of(d.data_t), test::bytes_of(h.data_t)) << "columnwise codes";
  EXPECT_EQ(test::bytes_of(d.scale_t), test::bytes_of(h.scale_t)) << "columnwise scales";
}

using Param = std::tuple<DType, DType, int64_t, int64_t>;
class Mxfp8GpuTest : public ::testing::TestWithParam<Param> {};

TEST_P(Mxfp8GpuTest, QuantizeDbiasAndDequantizeMatchHostBitwise) {
  SKIP_WITHOUT_GPU();
  const auto [in, fp8, rows, cols] = GetParam();
  const Shape shape{rows, cols};
  const Tensor x = test::special_input(in, shape, 7, /*nonfinite=*/false);
  Tensor dx(in, shape, kGpu);
  copy_tensor(dx, x);
  for (const bool columnwise : {false, true})
    for (const float margin : {0.0f, 1.0f}) {
      SCOPED_TRACE(testing::Message() << "columnwise=" << columnwise << " margin=" << margin);
      MxFp8Tensor h(fp8, shape, Device::host(), columnwise), d(fp8, shape, kGpu, columnwise);
      mxfp8_quantize(x, h.view(), margin);
      mxfp8_quantize(dx, d.view(), margin);
      expect_same(d.view(), h.view());
      Tensor hb(DType::kFloat32, Shape{cols}), db(DType::kFloat32, Shape{cols}, kGpu);
      mxfp8_dbias_quantize(x, h.view(), hb, margin);
      mxfp8_dbias_quantize(dx, d.view(), db, margin);
      expect_same(d.view(), h.view());
      EXPECT_EQ(test::bytes_of(db), test::bytes_of(hb)) << "dbias";
      for (const DType out : {DType::kFloat32, DType::kBFloat16}) {
        Tensor hy(out, shape), dy(out, shape, kGpu);
        mxfp8_dequantize(h.view(), hy);
        mxfp8_dequantize(d.view(), dy);
        EXPECT_EQ(test::bytes_of(dy), test::bytes_of(hy)) << "dequantized to " << dtype_name(out);
      }
    }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Mxfp8GpuTest,
                         ::testing::Values(Param{DType::kBFloat16, DType::kFloat8E4M3, 256, 512},
                                           Param{DType::kFloat32, DType::kFloat8E4M3, 96, 160},
                                           Param{DType::kFloat16, DType::kFloat8E5M2, 32, 32},
                                           Param{DType::kBFloat16, DType::kFloat8E5M2, 2048,
                                                 1536}));

TEST(Mxfp8Gpu, NanAndInfBlocksMatchHostBitwise) {
  SKIP_WITHOUT_GPU();
  const Shape shape{320, 544};
  const Tensor x = test::special_input(DType::kBFloat16, shape, 9, /*nonfinite=*/true);
  Tensor dx(x.dtype(), shape, kGpu);
  copy_tensor(dx, x);
  MxFp8Tensor h(DType::kFloat8E4M3, shape, Device::host(), true);
  MxFp8Tensor d(DType::kFloat8E4M3, shape, kGpu, true);
  mxfp8_quantize(x, h.view());
  mxfp8_quantize(dx, d.view());
  expect_same(d.view(), h.view());
}

// The emulated GEMM on CUDA (bf16 operands, exact) against the host's (fp32 operands): the
// same products, accumulated in fp32 in different orders.
TEST(Mxfp8GpuGemm, EmulatedGemmMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  const int64_t m = 128, n = 96, k = 256;
  const Tensor x = test::random_wide(DType::kFloat32, Shape{m, k}, 1);
  const Tensor w = test::random_wide(DType::kFloat32, Shape{n, k}, 2);
  Tensor dx(DType::kFloat32, x.shape(), kGpu), dw(DType::kFloat32, w.shape(), kGpu);
  copy_tensor(dx, x);
  copy_tensor(dw, w);
  MxFp8Tensor hx(DType::kFloat8E4M3, x.shape(), Device::host(), false);
  MxFp8Tensor hw(DType::kFloat8E4M3, w.shape(), Device::host(), false);
  MxFp8Tensor gx(DType::kFloat8E4M3, x.shape(), kGpu, false);
  MxFp8Tensor gw(DType::kFloat8E4M3, w.shape(), kGpu, false);
  mxfp8_quantize(x, hx.view());
  mxfp8_quantize(w, hw.view());
  mxfp8_quantize(dx, gx.view());
  mxfp8_quantize(dw, gw.view());
  Tensor hd(DType::kFloat32, Shape{m, n}), gd(DType::kFloat32, Shape{m, n}, kGpu);
  GemmArgs args;
  args.emulate_microscaled = true;
  args.a = GemmOperand::mxfp8(hx.view());
  args.b = GemmOperand::mxfp8(hw.view());
  args.d = hd.view();
  gemm(args);
  args.a = GemmOperand::mxfp8(gx.view());
  args.b = GemmOperand::mxfp8(gw.view());
  args.d = gd.view();
  gemm(args);
  synchronize(kGpu);
  std::vector<float> got(size_t(m * n));
  copy_bytes(got.data(), Device::host(), gd.data(), kGpu, gd.nbytes());
  const auto* want = static_cast<const float*>(hd.data());
  EXPECT_LE(test::relative_rms_error(got.data(), want, got.size()), 1e-5);
}

}  // namespace
}  // namespace qmesh
