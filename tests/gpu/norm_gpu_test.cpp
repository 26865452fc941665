// The CUDA norm_forward kernel against its host twin (cpu/norm.cpp), bit for bit: y, mean,
// rstd, the rowwise and columnwise codes, scale_inv and amax, for LayerNorm and RMSNorm, fp32
// and bf16 input and output, widths below, at and above the kernel's 256 lanes and not
// multiples of 16, rows at and above the 8192 columns a block holds in registers (wider rows
// are re-read, and write their columnwise copy without staging it), row counts that fill the
// kernel's 16-row tiles or leave a partial one (with and without whole 16-byte stores of the
// columnwise copy), a columnwise copy that is not 16-byte aligned, rows with a NaN, and the
// amax-only pass of current scaling; an empty input is an error. Skips without a CUDA device.
#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "expect_error.h"
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
  // The columnwise codes: q's own, or (t_offset > 0) t_offset bytes into a buffer of their own.
  Tensor t_storage;
  TensorView codes_t;

  NormRun(const Tensor& x, const Tensor& gamma, const Tensor& beta, NormType type, DType y_dtype,
          Device device, int64_t t_offset = 0)
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
    codes_t = q.data_t();
    if (t_offset > 0) {
      t_storage = Tensor(DType::kFloat8E4M3, Shape{x.shape().numel() + t_offset}, device);
      codes_t = TensorView(static_cast<uint8_t*>(t_storage.data()) + t_offset, DType::kFloat8E4M3,
                           q.data_t().shape(), device);
    }
    out.codes = q.view();
    out.codes.data_t = codes_t;
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

// Every output of the two runs is the same, bit for bit.
void expect_same(const NormRun& gpu, const NormRun& host, NormType type) {
  EXPECT_EQ(bytes_of(gpu.y), bytes_of(host.y));
  if (type == NormType::kLayerNorm) {
    EXPECT_EQ(bytes_of(gpu.mean), bytes_of(host.mean));
  }
  EXPECT_EQ(bytes_of(gpu.rstd), bytes_of(host.rstd));
  EXPECT_EQ(bytes_of(gpu.q.data()), bytes_of(host.q.data()));
  EXPECT_EQ(bytes_of(gpu.codes_t), bytes_of(host.codes_t));
  EXPECT_EQ(bytes_of(gpu.q.scalars()), bytes_of(host.q.scalars()));
  EXPECT_EQ(bytes_of(gpu.pass1_amax), bytes_of(host.pass1_amax));
}

TEST(NormGpu, MatchesTheHostTwinBitForBit) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  for (const NormType type : {NormType::kLayerNorm, NormType::kRmsNorm})
    for (const DType x_dtype : {DType::kFloat32, DType::kBFloat16})
      for (const DType y_dtype : {DType::kFloat32, DType::kBFloat16})
        for (const int64_t cols : {1, 37, 256, 300, 4096, 5000})
          // 96 and 48: whole tiles; 67: a partial last tile, rows % 16 != 0.
          for (const int64_t rows : {96, 48, 67}) {
            Tensor x = test::random_wide(x_dtype, Shape{rows, cols}, 3);
            // NaN rows, one in the first tile and one in the last (elsewhere the amax stays finite)
            if (cols == 37)
              test::set_wide(x, 5 * cols + cols / 2, std::numeric_limits<float>::quiet_NaN());
            if (cols == 300)
              test::set_wide(x, (rows - 1) * cols + 7, std::numeric_limits<float>::quiet_NaN());
            const Tensor gamma = test::random_wide(DType::kFloat32, Shape{cols}, 4);
            const Tensor beta = test::random_wide(DType::kFloat32, Shape{cols}, 5);
            const NormRun host(x, gamma, beta, type, y_dtype, Device::host());
            const NormRun gpu(x, gamma, beta, type, y_dtype, kGpu);
            SCOPED_TRACE(testing::Message()
                         << "rows " << rows << " cols " << cols << " rms " << int(type) << " x "
                         << dtype_name(x_dtype) << " y " << dtype_name(y_dtype));
            expect_same(gpu, host, type);
          }
}

TEST(NormGpu, WideRowsMatchTheHostTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // 8192: the widest row held in registers and staged; 8193 and 16700: rows re-read chunk by
  // chunk, the last chunk partial, the columnwise copy written without staging.
  for (const NormType type : {NormType::kLayerNorm, NormType::kRmsNorm})
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16})
      for (const int64_t cols : {8192, 8193, 16700})
        for (const int64_t rows : {32, 19}) {
          const Tensor x = test::random_wide(dtype, Shape{rows, cols}, 9);
          const Tensor gamma = test::random_wide(DType::kFloat32, Shape{cols}, 10);
          const Tensor beta = test::random_wide(DType::kFloat32, Shape{cols}, 11);
          const NormRun host(x, gamma, beta, type, dtype, Device::host());
          const NormRun gpu(x, gamma, beta, type, dtype, kGpu);
          SCOPED_TRACE(testing::Message() << "rows " << rows << " cols " << cols << " rms "
                                          << int(type) << " " << dtype_name(dtype));
          expect_same(gpu, host, type);
        }
}

TEST(NormGpu, UnalignedColumnwiseCopyMatchesTheHostTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  // rows % 16 == 0, but the columnwise copy starts 1 byte past a 16-byte boundary: the kernel
  // falls back to element stores.
  const int64_t rows = 96, cols = 300;
  const Tensor x = test::random_wide(DType::kBFloat16, Shape{rows, cols}, 6);
  const Tensor gamma = test::random_wide(DType::kFloat32, Shape{cols}, 7);
  const Tensor beta = test::random_wide(DType::kFloat32, Shape{cols}, 8);
  const NormRun host(x, gamma, beta, NormType::kLayerNorm, DType::kBFloat16, Device::host());
  const NormRun gpu(x, gamma, beta, NormType::kLayerNorm, DType::kBFloat16, kGpu, 1);
  EXPECT_EQ(bytes_of(gpu.codes_t), bytes_of(host.codes_t));
  EXPECT_EQ(bytes_of(gpu.q.data()), bytes_of(host.q.data()));
}

TEST(NormGpu, EmptyInputIsAnError) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Tensor gamma(DType::kFloat32, Shape{8}, kGpu), beta(DType::kFloat32, Shape{8}, kGpu);
  const Tensor y(DType::kFloat32, Shape{4, 8}, kGpu);
  NormOutputs out;
  out.y = y;
  EXPECT_QMESH_ERROR(norm_forward(TensorView{}, gamma, beta, {}, out), "empty view");
}

}  // namespace
}  // namespace qmesh
