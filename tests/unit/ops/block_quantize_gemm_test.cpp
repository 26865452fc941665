// block_quantize's output as the block-scaled GEMM reads it: the three layer GEMMs of
// tensors quantized by block_quantize (rowwise and columnwise copies) must equal, in float64,
// the GEMMs of the values block_dequantize gives back for the copies the GEMM reads. A
// quantize that wrote scales where the GEMM does not look for them (the layout of
// qmesh/block_quantized_tensor.h) fails here.
#include <gtest/gtest.h>

#include <vector>

#include "block_gemm_test_util.h"
#include "gemm_test_util.h"
#include "qmesh/ops/block_quantize.h"
#include "quant_test_util.h"

namespace qmesh::test {
namespace {

// The values of one copy of q ([rows, cols] rowwise, or the columnwise copy [cols, rows]).
std::vector<double> dequantized(const BlockQuantizedTensor& q, bool columnwise) {
  BlockQuantizedTensorView v;
  v.block = q.block();
  v.data = columnwise ? q.data_t().view() : q.data().view();
  v.scale_inv = columnwise ? q.scale_inv_t().view() : q.scale_inv().view();
  Tensor out(DType::kFloat32, v.data.shape);
  block_dequantize(v, out);
  return std::vector<double>(out.data_as<float>(), out.data_as<float>() + out.numel());
}

BlockQuantizedTensor quantized(const Tensor& x, DType fp8, BlockShape block) {
  BlockQuantizedTensor q(fp8, x.shape(), block, Device::host(), true);
  block_quantize(x, q.view(), QParams{false, 0.0f});
  return q;
}

std::vector<double> run(const BlockQuantizedTensor& a, const BlockQuantizedTensor& b,
                        GemmTranspose ta, GemmTranspose tb, int64_t m, int64_t n) {
  Tensor d(DType::kFloat32, Shape{m, n});
  gemm(block_args(a, b, d.view(), ta, tb));
  return std::vector<double>(d.data_as<float>(), d.data_as<float>() + d.numel());
}

TEST(BlockQuantizeGemm, LayerGemmsOfQuantizedTensorsMatchTheirDequantizedValues) {
  const int64_t t = 200, in = 300, out = 136;  // partial blocks in every dimension
  const Tensor x_wide = random_wide(DType::kBFloat16, Shape{t, in}, 1);
  const Tensor w_wide = random_wide(DType::kFloat32, Shape{out, in}, 2);
  const Tensor dy_wide = random_wide(DType::kFloat32, Shape{t, out}, 3);
  const BlockQuantizedTensor x = quantized(x_wide, DType::kFloat8E4M3, BlockShape::k1x128);
  const BlockQuantizedTensor w = quantized(w_wide, DType::kFloat8E4M3, BlockShape::k128x128);
  const BlockQuantizedTensor dy = quantized(dy_wide, DType::kFloat8E5M2, BlockShape::k1x128);
  using enum GemmTranspose;
  const double tol = output_tolerance(DType::kFloat32);
  // fprop y [T, OUT] = x · wᵀ: x and w rowwise.
  EXPECT_LT(relative_error(
                run(x, w, kNo, kYes, t, out),
                block_reference(dequantized(x, false), dequantized(w, false), t, out, in, 1.0)),
            tol);
  // dgrad dx [T, IN] = dy · w: dy rowwise, w through its columnwise copy.
  EXPECT_LT(relative_error(
                run(dy, w, kNo, kNo, t, in),
                block_reference(dequantized(dy, false), dequantized(w, true), t, in, out, 1.0)),
            tol);
  // wgrad dw [OUT, IN] = dyᵀ · x: both through their columnwise copies.
  EXPECT_LT(
      relative_error(run(dy, x, kYes, kNo, out, in),
                     block_reference(dequantized(dy, true), dequantized(x, true), out, in, t, 1.0)),
      tol);
}

}  // namespace
}  // namespace qmesh::test
