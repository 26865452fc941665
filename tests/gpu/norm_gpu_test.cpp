// The CUDA norm_forward kernel against its host twin (cpu/norm.cpp), bit for bit: y, mean,
// rstd, the rowwise and columnwise codes, scale_inv and amax, for LayerNorm and RMSNorm, fp32
// and bf16 input and output, widths below, at and above the kernel's 256 lanes, a row with a
// NaN, and the amax-only pass of current scaling. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/ops/norm_forward.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

const Device kGpu = Device::cuda(0);

Tensor on(const Tensor& t, Device device) {
  Tensor out(t.dtype(), t.shape(), device);
  copy_tensor(out, t);
  return out;
}

std::vector<uint8_t> bytes_of(const TensorView& t) {
  std::vector<uint8_t> out(t.nbytes());
  copy_bytes(out.data(), Device::host(), t.data, t.device, t.nbytes());
  return out;
}

// Everything one norm_forward call with codes writes, on `device`.
struct NormRun {
  Tensor y, mean, rstd, pass1_amax;
  QuantizedTensor q;

  NormRun(const Tensor& x, const Tensor& gamma, const Tensor& beta, NormType type, DType y_dtype,
          Device device)
      : y(y_dtype, x.shape(), device),
        mean(DType::kFloat32, Shape{x.shape().rows()}, device),
        rstd(DType::kFloat32, Shape{x.shape().rows()}, device),
        pass1_amax(DType::kFloat32, Shape{1}, device),
        q(DType::kFloat8E4M3, x.shape(), device, true) {
    const float scale = 2.5f;
    copy_bytes(q.view().scale, device, &scale, Device::host(), sizeof scale);
    const Tensor dx = on(x, device), dg = on(gamma, device), db = on(beta, device);
    const bool rms = type == NormType::kRmsNorm;
    const NormSpec spec{type, 1e-5f, rms};
    NormOutputs out;
    out.y_dtype = y_dtype;
    out.y = y;
    out.codes = q.view();
    if (!rms) out.mean = mean;
    out.rstd = rstd;
    norm_forward(dx, dg, rms ? TensorView{} : db.view(), spec, out);
    NormOutputs pass1;
    pass1.y_dtype = y_dtype;
    pass1.amax = pass1_amax;
    norm_forward(dx, dg, rms ? TensorView{} : db.view(), spec, pass1);
    if (!device.is_host()) synchronize(device);
  }
};

TEST(NormGpu, MatchesTheHostTwinBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const NormType type : {NormType::kLayerNorm, NormType::kRmsNorm})
    for (const DType x_dtype : {DType::kFloat32, DType::kBFloat16})
      for (const DType y_dtype : {DType::kFloat32, DType::kBFloat16})
        for (const int64_t cols : {1, 37, 256, 300, 4096, 5000}) {
          const int64_t rows = 67;
          Tensor x = test::random_wide(x_dtype, Shape{rows, cols}, 3);
          if (cols == 37)  // a NaN row (elsewhere the amax stays finite)
            test::set_wide(x, 5 * cols + cols / 2, std::numeric_limits<float>::quiet_NaN());
          const Tensor gamma = test::random_wide(DType::kFloat32, Shape{cols}, 4);
          const Tensor beta = test::random_wide(DType::kFloat32, Shape{cols}, 5);
          const NormRun host(x, gamma, beta, type, y_dtype, Device::host());
          const NormRun gpu(x, gamma, beta, type, y_dtype, kGpu);
          SCOPED_TRACE(testing::Message() << "cols " << cols << " rms " << int(type));
          EXPECT_EQ(bytes_of(gpu.y), bytes_of(host.y));
          if (type == NormType::kLayerNorm) {
            EXPECT_EQ(bytes_of(gpu.mean), bytes_of(host.mean));
          }
          EXPECT_EQ(bytes_of(gpu.rstd), bytes_of(host.rstd));
          EXPECT_EQ(bytes_of(gpu.q.data()), bytes_of(host.q.data()));
          EXPECT_EQ(bytes_of(gpu.q.data_t()), bytes_of(host.q.data_t()));
          EXPECT_EQ(bytes_of(gpu.q.scalars()), bytes_of(host.q.scalars()));
          EXPECT_EQ(bytes_of(gpu.pass1_amax), bytes_of(host.pass1_amax));
        }
}

}  // namespace
}  // namespace qmesh
