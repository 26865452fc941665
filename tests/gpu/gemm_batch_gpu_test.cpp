// The strided-batched cuBLASLt GEMM (GemmArgs::batch) against its host twin on the same
// inputs (the host one is tested bit for bit against per-element 2-D GEMMs in
// tests/unit/ops/gemm_batch_test.cpp). Skips without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "gemm_test_util.h"
#include "qmesh/copy.h"
#include "qmesh/device.h"
#include "qmesh/ops/gemm.h"

namespace qmesh::test {
namespace {

constexpr DType kE4 = DType::kFloat8E4M3, kE5 = DType::kFloat8E5M2, kF32 = DType::kFloat32,
                kBf16 = DType::kBFloat16;
constexpr int64_t kBatch = 4;
constexpr GemmTranspose kN = GemmTranspose::kNo, kT = GemmTranspose::kYes;

struct Case {
  DType a, b, d;
  GemmTranspose ta, tb;
  GemmEpilogue epilogue;
  GemmAccumulation accumulation = GemmAccumulation::kSplit;
};

std::string case_name(const testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return std::string(dtype_name(c.a)) + "x" + std::string(dtype_name(c.b)) + "_to_" +
         std::string(dtype_name(c.d)) + "_" + (c.ta == kT ? "T" : "N") + (c.tb == kT ? "T" : "N") +
         "_" + gemm_epilogue_name(c.epilogue) +
         (c.accumulation == GemmAccumulation::kFast ? "_fast" : "");
}

// The tolerance of tests/gpu/gemm_gpu_test.cpp (docs/numerics.md "Tolerances").
double gpu_tolerance(const Case& c) {
  double tol = 2 * output_tolerance(c.d);
  if (is_fp8(c.a))
    tol = std::max(tol, c.accumulation == GemmAccumulation::kFast ? 1e-2 : std::ldexp(4.0, -14));
  return tol;
}

// A host batch [kBatch, rows, cols] (one scale for all elements) and its copy on `dev`.
struct Operand {
  Matrix host;  // [kBatch · rows, cols]
  Tensor data, scalars;
  Operand(const Matrix& m, int64_t rows, Device dev)
      : host(m), data(m.dtype, Shape{kBatch, rows, m.cols}, dev), scalars(kF32, Shape{3}, dev) {
    copy_bytes(data.data(), dev, m.bytes.data(), Device::host(), m.bytes.size());
    copy_bytes(scalars.data(), dev, m.scalars, Device::host(), sizeof(m.scalars));
  }
  static GemmOperand operand(const TensorView& v, float* scalars) {
    if (!is_fp8(v.dtype)) return GemmOperand::plain(v);
    QuantizedTensorView q;
    q.data = v;
    q.scale = scalars;
    q.scale_inv = scalars + 1;
    q.amax = scalars + 2;
    return GemmOperand::fp8(q);
  }
  GemmOperand on_host() {
    return operand(TensorView(host.bytes.data(), host.dtype, data.shape()), host.scalars);
  }
  GemmOperand on_device() const { return operand(data.view(), scalars.data_as<float>()); }
};

class GemmBatchGpu : public testing::TestWithParam<Case> {};

TEST_P(GemmBatchGpu, MatchesHostTwin) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Case& c = GetParam();
  const Device dev = Device::cuda(0);
  const int64_t m = 32, n = 48, k = 64;
  const bool at = c.ta == kT, bt = c.tb == kT;
  const int64_t a_rows = at ? k : m, b_rows = bt ? n : k;
  Operand a(random_matrix(c.a, kBatch * a_rows, at ? m : k, 1), a_rows, dev);
  Operand b(random_matrix(c.b, kBatch * b_rows, bt ? k : n, 2), b_rows, dev);
  const DType side = kBf16;
  const Matrix bias = random_matrix(side, 1, n, 3);
  Tensor bias_d(side, Shape{n}, dev);
  copy_bytes(bias_d.data(), dev, bias.bytes.data(), Device::host(), bias.bytes.size());
  float d_scale = 8.0f;
  Tensor d_scale_d(kF32, Shape{1}, dev);
  copy_bytes(d_scale_d.data(), dev, &d_scale, Device::host(), sizeof(d_scale));

  GemmArgs args;
  args.trans_a = c.ta;
  args.trans_b = c.tb;
  args.alpha = 0.5f;
  args.epilogue = c.epilogue;
  args.accumulation = c.accumulation;
  args.batch = kBatch;

  Matrix d_h(c.d, kBatch * m, n);
  GemmArgs host = args;
  host.a = a.on_host();
  host.b = b.on_host();
  host.d = TensorView(d_h.bytes.data(), c.d, Shape{kBatch, m, n});
  if (c.epilogue == GemmEpilogue::kBias)
    host.bias = TensorView(const_cast<uint8_t*>(bias.bytes.data()), side, Shape{n});
  if (is_fp8(c.d)) host.d_scale = &d_scale;
  gemm(host);

  Tensor d_d(c.d, Shape{kBatch, m, n}, dev);
  GemmArgs device = args;
  device.a = a.on_device();
  device.b = b.on_device();
  device.d = d_d.view();
  if (c.epilogue == GemmEpilogue::kBias) device.bias = bias_d.view();
  if (is_fp8(c.d)) device.d_scale = d_scale_d.data_as<float>();
  const Status supported = Gemm::can_implement(device);
  ASSERT_TRUE(supported) << supported.reason();
  gemm(device);  // the blocking copy below orders after it on the legacy default stream

  Matrix out(c.d, kBatch * m, n);
  copy_bytes(out.bytes.data(), Device::host(), d_d.data(), dev, out.bytes.size());
  // Element by element, so that an element computed from the wrong stride cannot hide in the
  // norm of the whole batch.
  const std::vector<double> got = out.values(), want = d_h.values();
  for (int64_t i = 0; i < kBatch; ++i) {
    const auto first = got.begin() + i * m * n, ref = want.begin() + i * m * n;
    EXPECT_LE(relative_error({first, first + m * n}, {ref, ref + m * n}), gpu_tolerance(c))
        << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmBatchGpu,
                         testing::Values(Case{kE4, kE4, kBf16, kN, kT, GemmEpilogue::kNone},
                                         Case{kE4, kE5, kF32, kN, kT, GemmEpilogue::kBias},
                                         Case{kE5, kE4, kBf16, kN, kT, GemmEpilogue::kNone,
                                              GemmAccumulation::kFast},
                                         Case{kE4, kE4, kE4, kN, kT, GemmEpilogue::kNone},
                                         Case{kBf16, kBf16, kBf16, kN, kN, GemmEpilogue::kBias},
                                         Case{kF32, kF32, kF32, kT, kT, GemmEpilogue::kGelu},
                                         Case{kBf16, kBf16, kF32, kT, kN, GemmEpilogue::kNone}),
                         case_name);

}  // namespace
}  // namespace qmesh::test
