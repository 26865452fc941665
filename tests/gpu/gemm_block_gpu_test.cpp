// The block-scaled FP8 GEMM on cuBLASLt (VEC128_32F / BLK128x128_32F scale modes) against the
// host GEMM (itself tested against float64 in tests/unit/ops/gemm_block_test.cpp) on the same
// codes and scales, in the three layer forms, with whole and partial blocks, D fp32 and bf16,
// through gemm() and gemm_planned(). A wrong scale layout (the header's is meant to be
// cuBLASLt's) or scale modes not swapped with the operands shows as errors of order 1. Skips
// without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <string>
#include <vector>

#include "block_gemm_test_util.h"
#include "qmesh/copy.h"
#include "qmesh/device.h"

namespace qmesh::test {
namespace {

constexpr DType kE4 = DType::kFloat8E4M3, kE5 = DType::kFloat8E5M2, kF32 = DType::kFloat32,
                kBf16 = DType::kBFloat16;
constexpr BlockShape k1D = BlockShape::k1x128, k2D = BlockShape::k128x128;

// A device copy of a host block-scaled operand (codes and scales of both copies).
BlockQuantizedTensor to_device(const BlockQuantizedTensor& h, Device dev) {
  BlockQuantizedTensor d(h.dtype(), h.shape(), h.block(), dev, h.has_columnwise());
  auto copy = [&](const Tensor& to, const Tensor& from) {
    copy_bytes(to.data(), dev, from.data(), Device::host(), from.nbytes());
  };
  copy(d.data(), h.data());
  copy(d.scale_inv(), h.scale_inv());
  if (h.has_columnwise()) {
    copy(d.data_t(), h.data_t());
    copy(d.scale_inv_t(), h.scale_inv_t());
  }
  return d;
}

std::vector<double> values_of(const Tensor& d) {
  std::vector<uint8_t> bytes(d.nbytes());
  copy_bytes(bytes.data(), Device::host(), d.data(), d.device(), bytes.size());
  std::vector<double> v(size_t(d.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = decode(d.dtype(), bytes.data() + i * dtype_size(d.dtype()));
  return v;
}

struct Form {
  const char* name;
  BlockShape a_block, b_block;
  DType a_dtype;
  GemmTranspose ta, tb;
  GemmAccumulation accumulation;
  int64_t a_rows, a_cols, b_rows, b_cols, m, n;
};

// The three layer GEMMs over tokens T, input features IN, output features OUT (as in
// gemm_block_test.cpp). Split accumulation, the one mode known to be offered with block
// scales (TransformerEngine uses only it; PyTorch refuses fast accumulation with them): fast
// accumulation is probed by bench/gemm_block_gpu_bench.
std::vector<Form> layer_forms(int64_t t, int64_t in, int64_t out) {
  using enum GemmTranspose;
  using enum GemmAccumulation;
  return {
      {"fprop 1Dx2D", k1D, k2D, kE4, kNo, kYes, kSplit, t, in, out, in, t, out},
      {"dgrad 1Dx2D", k1D, k2D, kE5, kNo, kNo, kSplit, t, out, out, in, t, in},
      {"wgrad 1Dx1D", k1D, k1D, kE5, kYes, kNo, kSplit, t, out, t, in, out, in},
  };
}

// cuBLASLt multiplies each 128-long partial sum of code products by the two blocks'
// scale_inv and accumulates those in fp32; the host dequantizes every element to fp32 first
// and accumulates the products in fp32. The difference is Hopper's FP8 accumulator inside each
// partial sum: with split accumulation the per-tensor FP8 GEMM measured ~1e-4 against the host
// (docs/benchmarks/gpu-h100.md), hence 4 · 2^-14 as in gemm_gpu_test.cpp; fast accumulation
// keeps fewer bits (1e-2). D's own rounding may then differ by one step: 2 · its unit
// roundoff.
double gpu_tolerance(DType d, GemmAccumulation acc) {
  return std::max(2 * output_tolerance(d),
                  acc == GemmAccumulation::kFast ? 1e-2 : std::ldexp(4.0, -14));
}

void run_form(const Form& f, DType d_dtype, uint32_t seed) {
  SCOPED_TRACE(std::string(f.name) + " M=" + std::to_string(f.m) + " N=" + std::to_string(f.n) +
               " D " + std::string(dtype_name(d_dtype)));
  const Device dev = Device::cuda(0);
  const BlockOperand a(f.a_dtype, f.a_block, f.a_rows, f.a_cols, seed, false);
  const BlockOperand b(kE4, f.b_block, f.b_rows, f.b_cols, seed + 1, false);
  Tensor d_host(d_dtype, Shape{f.m, f.n}, Device::host());
  GemmArgs host = block_args(a.tensor, b.tensor, d_host.view(), f.ta, f.tb);
  host.accumulation = f.accumulation;
  gemm(host);

  const BlockQuantizedTensor a_dev = to_device(a.tensor, dev), b_dev = to_device(b.tensor, dev);
  Tensor d_dev(d_dtype, Shape{f.m, f.n}, dev), d_planned(d_dtype, Shape{f.m, f.n}, dev);
  GemmArgs args = block_args(a_dev, b_dev, d_dev.view(), f.ta, f.tb);
  args.accumulation = f.accumulation;
  const Status supported = Gemm::can_implement(args);
  ASSERT_TRUE(supported) << supported.reason();
  gemm(args);  // the blocking copies below order after it on the legacy default stream
  args.d = d_planned.view();
  gemm_planned(args, nullptr, Stream{});

  const std::vector<double> ref = values_of(d_host), out = values_of(d_dev);
  EXPECT_LE(relative_error(out, ref), gpu_tolerance(d_dtype, f.accumulation));
  EXPECT_EQ(values_of(d_planned), out) << "gemm_planned must run the same GEMM";
}

TEST(BlockGemmGpu, LayerFormsMatchTheHost) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  uint32_t seed = 100;
  // Whole blocks, then partial ones (T = 208, IN = 272, OUT = 144: K of every form is not a
  // multiple of 128), within cuBLASLt's multiples (K, N of 16, M of 8).
  for (const auto& [t, in, out] :
       {std::array<int64_t, 3>{256, 384, 128}, std::array<int64_t, 3>{208, 272, 144}})
    for (const Form& f : layer_forms(t, in, out))
      for (DType d : {kF32, kBf16}) run_form(f, d, seed += 2);
}

}  // namespace
}  // namespace qmesh::test
