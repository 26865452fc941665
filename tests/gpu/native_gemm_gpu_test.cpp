// The native microscaled GEMM path on CUDA. The scale swizzle (cuda/scale_swizzle.cu) against
// its host twin, bit for bit, on any GPU; so is the NVFP4 GEMM's device alpha
// (cuda/gemm_device_scalars.cu). On compute capability 10.0+, the native MXFP8 GEMM (cuBLASLt,
// VEC32_UE8M0) and NVFP4 GEMM (VEC16_UE4M3, per-tensor scales in a device alpha) in the three
// layer forms against the host's emulated GEMM of the same operands (dequantized, fp32
// accumulation): the block products are exact in both, so only the order of the fp32 sums
// and where the per-tensor scales are applied differ. Skips without a GPU; the GEMM cases
// skip below 10.0.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gemm_layer_forms.h"
#include "gpu_cast_test_util.h"
#include "ops/gemm_device_scalars.h"
#include "ops/microscaled_gemm_path.h"
#include "ops/scale_swizzle.h"
#include "qmesh/copy.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/ops/gemm_emulation.h"
#include "qmesh/ops/mxfp8_quantize.h"
#include "qmesh/ops/nvfp4_quantize.h"

namespace qmesh {
namespace {

const Device kGpu = Device::cuda(0);

TEST(NativeGemmGpu, ScaleSwizzleMatchesHostBitwise) {
  SKIP_WITHOUT_GPU();
  const int64_t sizes[][2] = {{1, 1}, {31, 3}, {129, 5}, {256, 8}, {200, 13}};
  for (const auto& size : sizes)
    for (const DType dtype : {DType::kFloat8E8M0, DType::kFloat8E4M3}) {
      Tensor h(dtype, Shape{size[0], size[1]}), d(dtype, Shape{size[0], size[1]}, kGpu);
      auto* bytes = static_cast<uint8_t*>(h.data());
      for (int64_t i = 0; i < h.numel(); ++i) bytes[i] = uint8_t(i * 37 + 11);
      copy_tensor(d, h);
      const Shape out_shape = detail::swizzled_scale_shape(size[0], size[1]);
      Tensor ho(dtype, out_shape), dout(dtype, out_shape, kGpu);
      detail::swizzle_block_scales(h, ho, Stream{});
      detail::swizzle_block_scales(d, dout, Stream{});
      EXPECT_EQ(test::bytes_of(dout), test::bytes_of(ho))
          << dtype_name(dtype) << " [" << size[0] << ", " << size[1] << "]";
    }
}

TEST(NativeGemmGpu, DeviceAlphaMatchesHostBitwise) {
  SKIP_WITHOUT_GPU();
  const float scales[][3] = {{1.0f, 3.1f, 0.007f}, {0.75f, 1e-20f, 3e15f}, {-2.5f, 0.1f, 0.3f}};
  for (const auto& s : scales) {
    Tensor ha(DType::kFloat32, Shape{1}), hb(DType::kFloat32, Shape{1});
    *static_cast<float*>(ha.data()) = s[1];
    *static_cast<float*>(hb.data()) = s[2];
    Tensor da(DType::kFloat32, Shape{1}, kGpu), db(DType::kFloat32, Shape{1}, kGpu);
    copy_tensor(da, ha);
    copy_tensor(db, hb);
    Tensor ho(DType::kFloat32, Shape{2}), dout(DType::kFloat32, Shape{2}, kGpu);
    detail::write_gemm_device_scalars(ha, hb, s[0], 1.0f, ho, Stream{});
    detail::write_gemm_device_scalars(da, db, s[0], 1.0f, dout, Stream{});
    EXPECT_EQ(test::bytes_of(dout), test::bytes_of(ho)) << s[0] << " " << s[1] << " " << s[2];
  }
}

// x quantized as NVFP4 (or MXFP8 E4M3) on `device` with both copies (the CUDA and host casts
// give the same bits).
struct Quantized {
  MxFp8Tensor mx;
  NvFp4Tensor nv;

  Quantized(bool nvfp4, const Tensor& x, const Device& device) {
    Tensor on_device(x.dtype(), x.shape(), device);
    copy_tensor(on_device, x);
    if (nvfp4) {
      nv = NvFp4Tensor(x.shape(), device, true);
      nvfp4_quantize(on_device, nv.view(), NvFp4Options{});
    } else {
      mx = MxFp8Tensor(DType::kFloat8E4M3, x.shape(), device, true);
      mxfp8_quantize(on_device, mx.view());
    }
  }
  GemmOperand operand() const {
    return nv.data().data() ? GemmOperand::nvfp4(nv.view()) : GemmOperand::mxfp8(mx.view());
  }
};

TEST(NativeGemmGpu, MatchesTheEmulatedGemm) {
  SKIP_WITHOUT_GPU();
  const detail::MicroscaledGemmTarget target = detail::microscaled_gemm_target(kGpu);
  if (target.major < 10)
    GTEST_SKIP() << target.name << " (" << target.major << "." << target.minor
                 << ") has no native MXFP8 or NVFP4 GEMM";
  const int64_t m = 128, n = 96, k = 160;
  for (const bool nvfp4 : {false, true})
    for (const test::GemmLayerForm& f : test::gemm_layer_forms(m, n, k)) {
      SCOPED_TRACE(testing::Message() << (nvfp4 ? "NVFP4 " : "MXFP8 ") << f.name);
      const Tensor xa = test::random_wide(DType::kFloat32, Shape{f.a_rows, f.a_cols}, 1);
      const Tensor xb = test::random_wide(DType::kFloat32, Shape{f.b_rows, f.b_cols}, 2);
      std::vector<float> got, want;
      for (const Device& device : {kGpu, Device::host()}) {
        const Quantized a(nvfp4, xa, device), b(nvfp4, xb, device);
        Tensor d(DType::kFloat32, Shape{m, n}, device);
        GemmArgs args = test::layer_gemm_args(f, a.operand(), b.operand(), d.view());
        args.alpha = 0.5f;
        args.emulate_microscaled = device.is_host();
        const int64_t emulated_before = emulated_gemm_count();
        gemm(args, Stream{});
        EXPECT_EQ(emulated_gemm_count() - emulated_before, device.is_host() ? 1 : 0);
        Tensor host_d(DType::kFloat32, Shape{m, n});
        copy_tensor(host_d, d);
        const auto* p = static_cast<const float*>(host_d.data());
        (device.is_host() ? want : got).assign(p, p + m * n);
      }
      EXPECT_LE(test::relative_rms_error(got.data(), want.data(), got.size()), 1e-5);
    }
}

}  // namespace
}  // namespace qmesh
