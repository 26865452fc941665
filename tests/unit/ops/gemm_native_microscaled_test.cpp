// The host-side form of the native MXFP8 GEMM (ops/gemm_native_microscaled.h), built on host
// tensors (only the cuBLASLt launch needs a GPU): in the three layer forms cuBLASLt gets the
// TN problem over each operand's copy contiguous along K, VEC32_UE8M0 scaling, and scale
// pointers at buffers that hold, after refresh(), those copies' scales swizzled.
#include "ops/gemm_native_microscaled.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "expect_error.h"
#include "gemm_layer_forms.h"
#include "ops/scale_swizzle.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "quant_test_util.h"

namespace qmesh::detail {
namespace {

using enum GemmTranspose;

MxFp8Tensor quantized(int64_t rows, int64_t cols, uint32_t seed) {
  const Tensor x = test::random_wide(DType::kFloat32, Shape{rows, cols}, seed);
  MxFp8Tensor q(DType::kFloat8E4M3, Shape{rows, cols}, Device::host(), true);
  mxfp8_quantize(x.view(), q.view());
  return q;
}

// `scales` swizzled, as bytes.
std::vector<uint8_t> swizzled(const TensorView& scales) {
  Tensor out(DType::kFloat8E8M0, swizzled_scale_shape(scales.shape.rows(), scales.shape.cols()));
  swizzle_block_scales(scales, out, Stream{});
  const auto* p = static_cast<const uint8_t*>(out.data());
  return {p, p + out.numel()};
}

std::vector<uint8_t> bytes_at(const float* p, int64_t n) {
  const auto* b = reinterpret_cast<const uint8_t*>(p);
  return {b, b + n};
}

TEST(GemmNativeMicroscaled, ReadsTheKContiguousCopiesInTnFormWithSwizzledScales) {
  const int64_t m = 64, n = 96, k = 160;
  for (const test::GemmLayerForm& f : test::gemm_layer_forms(m, n, k)) {
    SCOPED_TRACE(f.name);
    const MxFp8Tensor a = quantized(f.a_rows, f.a_cols, 1), b = quantized(f.b_rows, f.b_cols, 2);
    Tensor d(DType::kBFloat16, Shape{m, n});
    const GemmArgs args = test::layer_gemm_args(f, GemmOperand::mxfp8(a.view()),
                                                GemmOperand::mxfp8(b.view()), d.view());
    const MxFp8TensorView av = a.view(), bv = b.view();
    const TensorView& a_codes = f.ta == kNo ? av.data : av.data_t;
    const TensorView& b_codes = f.tb == kYes ? bv.data : bv.data_t;
    const TensorView& a_scales = f.ta == kNo ? av.scale : av.scale_t;
    const TensorView& b_scales = f.tb == kYes ? bv.scale : bv.scale_t;

    const NativeMicroscaledOperands native(args);
    native.refresh(Stream{});
    const CanonicalGemm& c = native.canonical();
    EXPECT_EQ(c.a.data, a_codes.data);
    EXPECT_EQ(c.b.data, b_codes.data);
    EXPECT_EQ(c.a.dtype, DType::kFloat8E4M3);
    EXPECT_EQ(c.a.scaling, GemmScaling::kVec32Ue8m0);
    EXPECT_EQ(c.b.scaling, GemmScaling::kVec32Ue8m0);
    EXPECT_TRUE(c.cm.trans_a);
    EXPECT_FALSE(c.cm.trans_b);
    EXPECT_EQ(c.cm.m, n);
    EXPECT_EQ(c.cm.n, m);
    EXPECT_EQ(c.cm.k, k);
    EXPECT_EQ(c.cm.lda, k);
    EXPECT_EQ(c.cm.ldb, k);
    const std::vector<uint8_t> want_a = swizzled(a_scales), want_b = swizzled(b_scales);
    EXPECT_EQ(bytes_at(c.a.scale_inv, int64_t(want_a.size())), want_a);
    EXPECT_EQ(bytes_at(c.b.scale_inv, int64_t(want_b.size())), want_b);

    const CanonicalGemm probe = native_microscaled_probe(args);
    EXPECT_EQ(probe.a.data, c.a.data);
    EXPECT_EQ(probe.cm, c.cm);
    EXPECT_EQ(probe.b.scaling, GemmScaling::kVec32Ue8m0);
  }
}

TEST(GemmNativeMicroscaled, RefusesWhatTheEmulationRefuses) {
  const MxFp8Tensor a = quantized(32, 64, 3);
  MxFp8TensorView rowwise_only = a.view();
  rowwise_only.data_t = rowwise_only.scale_t = TensorView();
  Tensor d(DType::kFloat32, Shape{64, 64});
  GemmArgs args;
  args.a = GemmOperand::mxfp8(rowwise_only);
  args.b = GemmOperand::mxfp8(rowwise_only);
  args.trans_a = kYes;  // A stored [K, M]: read from its columnwise copy, which it lacks
  args.trans_b = kNo;
  args.d = d.view();
  EXPECT_QMESH_ERROR(native_microscaled_probe(args), "quantize it with a columnwise copy");
}

}  // namespace
}  // namespace qmesh::detail
