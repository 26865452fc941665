// The native microscaled GEMM path on CUDA. The scale swizzle (cuda/scale_swizzle.cu) against
// its host twin, bit for bit, on any GPU. On compute capability 10.0+, the native MXFP8 GEMM
// (cuBLASLt, VEC32_UE8M0) in the three layer forms against the host's emulated GEMM of the
// same operands (dequantized, fp32 accumulation): the products are exact in both, so only the
// order of the fp32 sums differs. Skips without a GPU; the GEMM cases skip below 10.0.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "gemm_layer_forms.h"
#include "gpu_cast_test_util.h"
#include "ops/microscaled_gemm_path.h"
#include "ops/scale_swizzle.h"
#include "qmesh/copy.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/ops/gemm_emulation.h"
#include "qmesh/ops/mxfp8_quantize.h"

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

// x quantized on `device` with both copies (the CUDA and host casts give the same bits).
MxFp8Tensor quantized(DType fp8, const Tensor& x, const Device& device) {
  MxFp8Tensor q(fp8, x.shape(), device, true);
  Tensor on_device(x.dtype(), x.shape(), device);
  copy_tensor(on_device, x);
  mxfp8_quantize(on_device, q.view());
  return q;
}

TEST(NativeGemmGpu, Mxfp8MatchesTheEmulatedGemm) {
  SKIP_WITHOUT_GPU();
  const detail::MicroscaledGemmTarget target = detail::microscaled_gemm_target(kGpu);
  if (target.major < 10)
    GTEST_SKIP() << target.name << " (" << target.major << "." << target.minor
                 << ") has no native MXFP8 GEMM";
  const int64_t m = 128, n = 96, k = 160;
  for (const test::GemmLayerForm& f : test::gemm_layer_forms(m, n, k)) {
    SCOPED_TRACE(f.name);
    const Tensor xa = test::random_wide(DType::kFloat32, Shape{f.a_rows, f.a_cols}, 1);
    const Tensor xb = test::random_wide(DType::kFloat32, Shape{f.b_rows, f.b_cols}, 2);
    std::vector<float> got, want;
    for (const Device& device : {kGpu, Device::host()}) {
      const MxFp8Tensor a = quantized(DType::kFloat8E4M3, xa, device);
      const MxFp8Tensor b = quantized(DType::kFloat8E4M3, xb, device);
      Tensor d(DType::kFloat32, Shape{m, n}, device);
      GemmArgs args = test::layer_gemm_args(f, GemmOperand::mxfp8(a.view()),
                                            GemmOperand::mxfp8(b.view()), d.view());
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
