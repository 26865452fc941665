// The host-side form of the native microscaled GEMMs (ops/gemm_native_microscaled.h), built
// on host tensors (only the cuBLASLt launch needs a GPU): for MXFP8 and NVFP4, in the three
// layer forms, cuBLASLt gets the TN problem over each operand's copy contiguous along K, the
// format's codes and VEC scale mode, and scale pointers at buffers that hold, after refresh(),
// those copies' scales swizzled; NVFP4 also alpha times both per-tensor decode scales as its
// device alpha.
#include "ops/gemm_native_microscaled.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "expect_error.h"
#include "gemm_layer_forms.h"
#include "ops/scale_swizzle.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "qmesh/ops/nvfp4_quantize.h"
#include "quant_test_util.h"

namespace qmesh::detail {
namespace {

using enum GemmTranspose;

enum class Format { kMxfp8, kNvfp4 };

// A [rows, cols] random tensor quantized in `format`, both copies.
struct Quantized {
  MxFp8Tensor mx;
  NvFp4Tensor nv;

  Quantized(Format format, int64_t rows, int64_t cols, uint32_t seed) {
    const Tensor x = test::random_wide(DType::kFloat32, Shape{rows, cols}, seed);
    if (format == Format::kNvfp4) {
      nv = NvFp4Tensor(Shape{rows, cols}, Device::host(), true);
      nvfp4_quantize(x.view(), nv.view(), NvFp4Options{});
    } else {
      mx = MxFp8Tensor(DType::kFloat8E4M3, Shape{rows, cols}, Device::host(), true);
      mxfp8_quantize(x.view(), mx.view());
    }
  }
  bool nvfp4() const { return nv.data().data() != nullptr; }
  GemmOperand operand() const {
    return nvfp4() ? GemmOperand::nvfp4(nv.view()) : GemmOperand::mxfp8(mx.view());
  }
  // The rowwise or the columnwise copy's codes, block scales and per-tensor scale (NVFP4).
  TensorView codes(bool rowwise) const {
    if (nvfp4()) return rowwise ? nv.data() : nv.data_t();
    return rowwise ? mx.view().data : mx.view().data_t;
  }
  TensorView scales(bool rowwise) const {
    if (nvfp4()) return rowwise ? nv.scale() : nv.scale_t();
    return rowwise ? mx.view().scale : mx.view().scale_t;
  }
  float scale_inv(bool rowwise) const {
    return *static_cast<const float*>((rowwise ? nv.scale_inv() : nv.scale_inv_t()).data());
  }
};

// `scales` swizzled, as bytes.
std::vector<uint8_t> swizzled(const TensorView& scales) {
  Tensor out(scales.dtype, swizzled_scale_shape(scales.shape.rows(), scales.shape.cols()));
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
  for (const Format format : {Format::kMxfp8, Format::kNvfp4})
    for (const test::GemmLayerForm& f : test::gemm_layer_forms(m, n, k)) {
      const bool nvfp4 = format == Format::kNvfp4;
      SCOPED_TRACE(testing::Message() << (nvfp4 ? "NVFP4 " : "MXFP8 ") << f.name);
      const Quantized a(format, f.a_rows, f.a_cols, 1), b(format, f.b_rows, f.b_cols, 2);
      Tensor d(DType::kBFloat16, Shape{m, n});
      GemmArgs args = test::layer_gemm_args(f, a.operand(), b.operand(), d.view());
      args.alpha = 0.75f;
      args.output = GemmOutputMode::kAccumulate;
      const bool a_rowwise = f.ta == kNo, b_rowwise = f.tb == kYes;

      const NativeMicroscaledOperands native(args);
      native.refresh(Stream{});
      const CanonicalGemm& c = native.canonical();
      EXPECT_EQ(c.a.data, a.codes(a_rowwise).data);
      EXPECT_EQ(c.b.data, b.codes(b_rowwise).data);
      EXPECT_EQ(c.a.dtype, nvfp4 ? DType::kFloat4E2M1x2 : DType::kFloat8E4M3);
      EXPECT_EQ(c.b.dtype, c.a.dtype);
      const GemmScaling scaling = nvfp4 ? GemmScaling::kVec16Ue4m3 : GemmScaling::kVec32Ue8m0;
      EXPECT_EQ(c.a.scaling, scaling);
      EXPECT_EQ(c.b.scaling, scaling);
      EXPECT_TRUE(c.cm.trans_a);
      EXPECT_FALSE(c.cm.trans_b);
      EXPECT_EQ(c.cm.m, n);
      EXPECT_EQ(c.cm.n, m);
      EXPECT_EQ(c.cm.k, k);
      EXPECT_EQ(c.cm.lda, k);  // elements, two per byte for FP4
      EXPECT_EQ(c.cm.ldb, k);
      const std::vector<uint8_t> want_a = swizzled(a.scales(a_rowwise));
      const std::vector<uint8_t> want_b = swizzled(b.scales(b_rowwise));
      EXPECT_EQ(bytes_at(c.a.scale_inv, int64_t(want_a.size())), want_a);
      EXPECT_EQ(bytes_at(c.b.scale_inv, int64_t(want_b.size())), want_b);
      if (nvfp4) {
        ASSERT_NE(c.device_alpha_beta, nullptr);
        const double product =
            0.75 * double(a.scale_inv(a_rowwise)) * double(b.scale_inv(b_rowwise));
        EXPECT_EQ(c.device_alpha_beta[0], float(product));
        EXPECT_EQ(c.device_alpha_beta[1], 1.0f);
      } else {
        EXPECT_EQ(c.device_alpha_beta, nullptr);
      }

      const CanonicalGemm probe = native_microscaled_probe(args);
      EXPECT_EQ(probe.a.data, c.a.data);
      EXPECT_EQ(probe.cm, c.cm);
      EXPECT_EQ(probe.b.scaling, scaling);
      EXPECT_EQ(probe.device_alpha_beta != nullptr, nvfp4);
    }
}

TEST(GemmNativeMicroscaled, Nvfp4NeedsKAMultipleOf32) {
  const Quantized a(Format::kNvfp4, 32, 48, 3), b(Format::kNvfp4, 16, 48, 4);
  Tensor d(DType::kFloat32, Shape{32, 16});
  const GemmArgs args =
      test::layer_gemm_args(test::gemm_layer_forms(32, 16, 48)[0], a.operand(), b.operand(), d);
  EXPECT_QMESH_ERROR(native_microscaled_probe(args),
                     "the native NVFP4 GEMM on host needs K to be a multiple of 32");
}

TEST(GemmNativeMicroscaled, RefusesWhatTheEmulationRefuses) {
  const Quantized a(Format::kMxfp8, 32, 64, 3);
  MxFp8TensorView rowwise_only = a.mx.view();
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
