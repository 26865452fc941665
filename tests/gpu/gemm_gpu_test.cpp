// The cuBLASLt GEMM against the host GEMM (itself tested against float64) on the same
// inputs, in every layout (FP8 through the columnwise copies), the FP8 input combinations,
// every output dtype and every epilogue. Skips without a GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "expect_error.h"
#include "gemm_test_util.h"
#include "qmesh/copy.h"
#include "qmesh/device.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/owned_stream.h"

namespace qmesh::test {
namespace {

constexpr DType kE4 = DType::kFloat8E4M3, kE5 = DType::kFloat8E5M2, kF32 = DType::kFloat32,
                kBf16 = DType::kBFloat16;

// A device copy of a host test matrix (and of its transpose and scalars for FP8). The views
// start `offset` rows into their allocations, so that with offset > 0 they are not 256-byte
// aligned the way cudaMalloc's allocations are (like the row chunks of a collective GEMM).
// The scalars are packed 4 bytes apart, so scale_inv is not 16-byte aligned: the GEMM must
// stage it for cuBLASLt (as it must D's amax in run_gpu_case).
struct DeviceMatrix {
  Tensor storage, storage_t, scalars;
  TensorView data, data_t;
  DeviceMatrix(const Matrix& m, Device dev, int64_t offset = 0)
      : storage(m.dtype, Shape{m.rows + offset, m.cols}, dev), scalars(kF32, Shape{3}, dev) {
    data = rows_at(storage, offset, m.rows);
    copy_bytes(data.data, dev, m.bytes.data(), Device::host(), m.bytes.size());
    copy_bytes(scalars.data(), dev, m.scalars, Device::host(), sizeof(m.scalars));
    if (!m.bytes_t.empty()) {
      storage_t = Tensor(m.dtype, Shape{m.cols + offset, m.rows}, dev);
      data_t = rows_at(storage_t, offset, m.cols);
      copy_bytes(data_t.data, dev, m.bytes_t.data(), Device::host(), m.bytes_t.size());
    }
  }
  static TensorView rows_at(const Tensor& t, int64_t first, int64_t rows) {
    const int64_t cols = t.shape().cols();
    return TensorView(
        static_cast<uint8_t*>(t.data()) + size_t(first * cols) * dtype_size(t.dtype()), t.dtype(),
        Shape{rows, cols}, t.device());
  }
  GemmOperand operand() const {
    if (!is_fp8(data.dtype)) return GemmOperand::plain(data);
    QuantizedTensorView q;
    q.data = data;
    q.data_t = data_t;
    float* s = scalars.data_as<float>();
    q.scale = s;
    q.scale_inv = s + 1;
    q.amax = s + 2;
    return GemmOperand::fp8(q);
  }
  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> out(data.nbytes());
    copy_bytes(out.data(), Device::host(), data.data, data.device, out.size());
    return out;
  }
};

struct GpuCase {
  DType a, b, d;
  GemmEpilogue epilogue = GemmEpilogue::kNone;
  GemmTranspose ta = GemmTranspose::kNo, tb = GemmTranspose::kYes;
  GemmOutputMode mode = GemmOutputMode::kWrite;
  GemmAccumulation accumulation = GemmAccumulation::kSplit;
  int64_t m = 96, n = 64, k = 128;
  int64_t offset = 0;  // rows by which A, B, D and aux start into their allocations
};

// Tolerance of CUDA vs host (docs/numerics.md "Tolerances"): both round D the same way up to
// accumulation order, so twice D's unit roundoff; with FP8 inputs the tensor cores accumulate
// with about 14 mantissa bits between promotions to fp32, so 4 * 2^-14 with split
// accumulation and 1e-2 with fast accumulation.
double gpu_tolerance(const GpuCase& c) {
  double tol = 2 * output_tolerance(c.d);
  if (is_fp8(c.a))
    tol = std::max(tol, c.accumulation == GemmAccumulation::kFast ? 1e-2 : std::ldexp(4.0, -14));
  return tol;
}

void run_gpu_case(const GpuCase& c) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  const bool at = c.ta == GemmTranspose::kYes, bt = c.tb == GemmTranspose::kYes;
  const Matrix a = at ? random_matrix(c.a, c.k, c.m, 1) : random_matrix(c.a, c.m, c.k, 1);
  const Matrix b = bt ? random_matrix(c.b, c.n, c.k, 2) : random_matrix(c.b, c.k, c.n, 2);
  Matrix d = c.mode == GemmOutputMode::kAccumulate ? random_matrix(c.d, c.m, c.n, 3)
                                                   : Matrix(c.d, c.m, c.n);
  // Bias and aux dtype: bf16, or fp16 with an fp16 D and with an FP8 D (where cuBLASLt's
  // GELU aux may be fp16 but not bf16, and C takes the bias's dtype).
  const DType side = c.d == DType::kFloat16 || is_fp8(c.d) ? DType::kFloat16 : kBf16;
  const bool bias_in =
      c.epilogue == GemmEpilogue::kBias || c.epilogue == GemmEpilogue::kBiasGeluAux;
  Matrix bias = bias_in ? random_matrix(side, 1, c.n, 4)
                        : Matrix(side, 1, c.epilogue == GemmEpilogue::kBiasGrad ? c.m : 1);
  Matrix aux = c.epilogue == GemmEpilogue::kDGelu ? random_matrix(side, c.m, c.n, 5, 3.0)
                                                  : Matrix(side, c.m, c.n);
  float scalars[2] = {is_fp8(c.d) ? 16.0f : 1.0f, -1.0f};  // D's scale, amax

  // Host result.
  Matrix a_h = a, b_h = b, d_h = d, bias_h = bias, aux_h = aux;
  float scalars_h[2] = {scalars[0], scalars[1]};
  GemmArgs host;
  host.a = a_h.operand();
  host.b = b_h.operand();
  host.trans_a = c.ta;
  host.trans_b = c.tb;
  host.d = d_h.view();
  host.output = c.mode;
  host.epilogue = c.epilogue;
  host.accumulation = c.accumulation;
  if (c.epilogue == GemmEpilogue::kBias || c.epilogue == GemmEpilogue::kBiasGeluAux ||
      c.epilogue == GemmEpilogue::kBiasGrad)
    host.bias = TensorView(bias_h.bytes.data(), side, Shape{bias.cols});
  if (c.epilogue == GemmEpilogue::kBiasGeluAux || c.epilogue == GemmEpilogue::kDGelu)
    host.aux = aux_h.view();
  if (is_fp8(c.d)) {
    host.d_scale = &scalars_h[0];
    host.d_amax = &scalars_h[1];
  }
  gemm(host);

  // Device result, same arguments on device copies.
  DeviceMatrix a_d(a, dev, c.offset), b_d(b, dev, c.offset), d_d(d, dev, c.offset),
      bias_d(bias, dev), aux_d(aux, dev, c.offset);
  Tensor dscal(kF32, Shape{2}, dev);
  copy_bytes(dscal.data(), dev, scalars, Device::host(), sizeof(scalars));
  GemmArgs args = host;
  args.a = a_d.operand();
  args.b = b_d.operand();
  args.d = d_d.data;
  if (!host.bias.empty()) args.bias = TensorView(bias_d.data.data, side, host.bias.shape, dev);
  if (!host.aux.empty()) args.aux = aux_d.data;
  if (is_fp8(c.d)) {
    args.d_scale = dscal.data_as<float>();
    args.d_amax = dscal.data_as<float>() + 1;
  }
  // cuBLASLt does not offer every fused epilogue with every dtype and layout on every GPU
  // and version (GELU and bias-gradient fusions with FP8 in particular); can_implement says
  // so, and the test reports those as skipped rather than as passed. A GEMM without an
  // epilogue must always have an algorithm.
  const Status supported = Gemm::can_implement(args);
  if (c.epilogue != GemmEpilogue::kNone &&
      supported.reason().find("cuBLASLt has no algorithm") != std::string::npos)
    GTEST_SKIP() << supported.reason();
  ASSERT_TRUE(supported) << supported.reason();
  gemm(args);  // the blocking copies below order after it on the legacy default stream

  Matrix out(c.d, c.m, c.n);
  out.bytes = d_d.bytes();
  EXPECT_LE(relative_error(out.values(), d_h.values()), gpu_tolerance(c));
  if (is_fp8(c.d)) {
    float dev_scalars[2];
    copy_bytes(dev_scalars, Device::host(), dscal.data(), dev, sizeof(dev_scalars));
    EXPECT_NEAR(dev_scalars[1], scalars_h[1], 1e-2 * scalars_h[1]);
  }
  if (c.epilogue == GemmEpilogue::kBiasGeluAux) {
    Matrix aux_out(side, c.m, c.n);
    aux_out.bytes = aux_d.bytes();
    EXPECT_LE(relative_error(aux_out.values(), aux_h.values()), gpu_tolerance(c));
  }
  if (c.epilogue == GemmEpilogue::kBiasGrad) {
    Matrix dbias(side, 1, c.m);
    dbias.bytes = bias_d.bytes();
    EXPECT_LE(relative_error(dbias.values(), bias_h.values()), 2 * output_tolerance(side));
  }
}

class GemmGpu : public testing::TestWithParam<GpuCase> {};
TEST_P(GemmGpu, MatchesHostBackend) { run_gpu_case(GetParam()); }

std::vector<GpuCase> gpu_cases() {
  std::vector<GpuCase> cases;
  for (GemmTranspose ta : {GemmTranspose::kNo, GemmTranspose::kYes})
    for (GemmTranspose tb : {GemmTranspose::kNo, GemmTranspose::kYes})
      for (DType in : {kE4, kBf16, kF32})  // cuBLASLt has fp32 x fp32 only to fp32
        cases.push_back({in, in, in == kF32 ? kF32 : kBf16, GemmEpilogue::kNone, ta, tb});
  cases.push_back({kE4, kE5, kF32});
  cases.push_back({kE5, kE4, kBf16});
  cases.push_back({kE4, kE4, DType::kFloat16});
  cases.push_back({kE4, kE4, kE4});
  cases.push_back({kE4, kE4, kE4, GemmEpilogue::kBiasGeluAux});
  GpuCase fast{kE4, kE4, kBf16};
  fast.accumulation = GemmAccumulation::kFast;
  cases.push_back(fast);
  for (GemmEpilogue e : {GemmEpilogue::kBias, GemmEpilogue::kGelu, GemmEpilogue::kBiasGeluAux,
                         GemmEpilogue::kDGelu, GemmEpilogue::kBiasGrad})
    for (DType in : {kE4, kBf16}) cases.push_back({in, in, kBf16, e});
  GpuCase acc{kE4, kE4, kF32};
  acc.mode = GemmOutputMode::kAccumulate;
  cases.push_back(acc);
  acc.a = acc.b = acc.d = kBf16;
  cases.push_back(acc);
  // The weight-gradient layout dW = dyᵀ · x, where the bias gradient is fused.
  for (DType in : {kE4, kBf16}) {
    GpuCase wgrad{in, in, kBf16, GemmEpilogue::kBiasGrad, GemmTranspose::kYes, GemmTranspose::kNo};
    cases.push_back(wgrad);
  }
  // Views 1 row into their allocations: 16-byte but not 256-byte aligned (FP8 rows of 48
  // bytes, bf16 rows of 96 or 128 bytes), as the row chunks of the collective GEMMs are.
  for (DType in : {kE4, kBf16}) {
    GpuCase shifted{in, in, kBf16};
    shifted.k = 48;
    shifted.offset = 1;
    cases.push_back(shifted);
    shifted.epilogue = GemmEpilogue::kBiasGeluAux;
    cases.push_back(shifted);
  }
  GpuCase odd{kBf16, kBf16, kBf16};
  odd.m = 7;
  odd.n = 9;
  odd.k = 50;  // plain dtypes have no leading-dimension rule
  cases.push_back(odd);
  return cases;
}

std::string describe(const GpuCase& c) {
  return std::string(dtype_name(c.a)) + "x" + std::string(dtype_name(c.b)) + "_to_" +
         std::string(dtype_name(c.d)) + "_" + gemm_epilogue_name(c.epilogue) + "_" +
         (c.ta == GemmTranspose::kYes ? "T" : "N") + (c.tb == GemmTranspose::kYes ? "T" : "N") +
         (c.mode == GemmOutputMode::kAccumulate ? "_acc" : "") +
         (c.accumulation == GemmAccumulation::kFast ? "_fast" : "") + "_" + std::to_string(c.m) +
         "x" + std::to_string(c.n) + "x" + std::to_string(c.k) +
         (c.offset ? "_offset" + std::to_string(c.offset) : "");
}
void PrintTo(const GpuCase& c, std::ostream* os) { *os << describe(c); }

std::string gpu_case_name(const testing::TestParamInfo<GpuCase>& info) {
  return std::to_string(info.index) + "_" + describe(info.param);
}

INSTANTIATE_TEST_SUITE_P(Cases, GemmGpu, testing::ValuesIn(gpu_cases()), gpu_case_name);

// Autotuning picks an algorithm that computes the same GEMM, and records it in the cache
// file keyed by the device and cuBLASLt version.
TEST(GemmGpuAutotune, TunesAndWritesTheCacheFile) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const std::string path = testing::TempDir() + "qmesh_gemm_autotune_test.txt";
  std::remove(path.c_str());
  setenv("QMESH_GEMM_AUTOTUNE", "1", 1);
  setenv("QMESH_GEMM_AUTOTUNE_FILE", path.c_str(), 1);
  GpuCase c{kE4, kE4, kBf16};
  c.m = 256;
  c.n = 384;
  c.k = 512;
  run_gpu_case(c);
  unsetenv("QMESH_GEMM_AUTOTUNE");
  unsetenv("QMESH_GEMM_AUTOTUNE_FILE");
  std::ifstream in(path);
  std::string line;
  ASSERT_TRUE(std::getline(in, line)) << "no entry in " << path;
  EXPECT_NE(line.find("cublasLt"), std::string::npos) << line;
  EXPECT_NE(line.find("m384 n256 k512"), std::string::npos) << line;
}

// D = A · Bᵀ (the default TN form) on device tensors.
GemmArgs tn_args(const DeviceMatrix& a, const DeviceMatrix& b, const Tensor& d) {
  GemmArgs args;
  args.a = a.operand();
  args.b = b.operand();
  args.d = d.view();
  return args;
}

// The cached cuBLASLt workspace of a stream (32 MiB) is freed when its OwnedStream is
// destroyed, so trainers and tests that create streams do not leak one per stream.
TEST(GemmGpuWorkspace, FreedWithItsOwnedStream) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  const Matrix a = random_matrix(kBf16, 64, 128, 1), b = random_matrix(kBf16, 96, 128, 2);
  const DeviceMatrix a_d(a, dev), b_d(b, dev);
  const Tensor d(kBf16, Shape{64, 96}, dev);
  const GemmArgs args = tn_args(a_d, b_d, d);
  const auto gemm_on_a_new_stream = [&] {
    const OwnedStream stream(dev);
    gemm(args, stream.get());
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.get().handle)), cudaSuccess);
  };
  gemm_on_a_new_stream();  // first use: cuBLASLt's handle and kernels, kept for the process
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  size_t free_before = 0, free_after = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
  for (int i = 0; i < 4; ++i) gemm_on_a_new_stream();
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
  // Four leaked workspaces would be 128 MiB; allow the driver's own bookkeeping a little.
  EXPECT_GE(free_after + (size_t(8) << 20), free_before)
      << "free memory fell by " << (free_before - free_after) / (1 << 20) << " MiB";
}

// gemm_planned keeps one plan per problem and re-points it: on three sets of tensors of one
// problem (other values, scales and bias; the scale_inv pointers not 16-byte aligned, so they
// are staged), with the cached workspace and with a caller's, every result equals a fresh
// gemm()'s bit for bit, and each differs from the previous round's.
TEST(GemmGpuPlanned, RepointedPlanEqualsAFreshGemm) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  const OwnedStream stream(dev);
  struct Round {
    DeviceMatrix a, b, bias;
    Tensor planned, fresh;
  };
  std::vector<std::unique_ptr<Round>> rounds;  // all alive: every round has its own addresses
  for (uint32_t r = 0; r < 3; ++r)
    rounds.emplace_back(new Round{DeviceMatrix(random_matrix(kE4, 64, 128, 10 + r, 1.0 + r), dev),
                                  DeviceMatrix(random_matrix(kE4, 96, 128, 20 + r), dev),
                                  DeviceMatrix(random_matrix(kBf16, 1, 96, 30 + r), dev),
                                  Tensor(kBf16, Shape{64, 96}, dev),
                                  Tensor(kBf16, Shape{64, 96}, dev)});
  Tensor workspace(DType::kFloat32, Shape{int64_t(size_t(32) << 18)}, dev);  // 32 MiB
  std::vector<uint8_t> previous;
  for (size_t r = 0; r < rounds.size(); ++r) {
    Round& round = *rounds[r];
    GemmArgs args = tn_args(round.a, round.b, round.planned);
    args.epilogue = GemmEpilogue::kBias;
    args.bias = TensorView(round.bias.data.data, kBf16, Shape{96}, dev);
    ASSERT_EQ(Gemm::workspace_size(args), workspace.nbytes());
    gemm_planned(args, r == 1 ? workspace.data() : nullptr, stream.get());
    args.d = round.fresh.view();
    gemm(args, stream.get());
    ASSERT_EQ(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.get().handle)), cudaSuccess);
    std::vector<uint8_t> planned(round.planned.nbytes()), fresh(round.fresh.nbytes());
    copy_bytes(planned.data(), Device::host(), round.planned.data(), dev, planned.size());
    copy_bytes(fresh.data(), Device::host(), round.fresh.data(), dev, fresh.size());
    EXPECT_EQ(planned, fresh) << "round " << r;
    EXPECT_NE(planned, previous) << "round " << r << " repeated the previous result";
    previous = planned;
  }
}

// Bad inputs that only the CUDA path can see (where pointers live, workspace alignment) or
// that cuBLASLt would reject opaquely: each must be a clear qmesh::Error, not a fault.
TEST(GemmGpuErrors, RefusedWithAClearMessage) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Device dev = Device::cuda(0);
  const Matrix a = random_matrix(kE4, 32, 64, 1), b = random_matrix(kE4, 48, 64, 2);
  const DeviceMatrix a_d(a, dev), b_d(b, dev);
  const Tensor d(kBf16, Shape{32, 48}, dev);
  const GemmArgs args = tn_args(a_d, b_d, d);
  ASSERT_TRUE(Gemm::can_implement(args)) << Gemm::can_implement(args).reason();

  // A caller's workspace must be 256-byte aligned.
  Tensor workspace(DType::kFloat32, Shape{int64_t(Gemm::workspace_size(args) / 4) + 64}, dev);
  Gemm op;
  EXPECT_QMESH_ERROR(op.initialize(args, workspace.data_as<float>() + 4, Stream{}),
                     "must be 256-byte aligned");

  // FP8 scale factors and amax are read and written on the GPU.
  float host_scalars[2] = {1.0f, 0.0f};
  GemmArgs host_scale = args;
  host_scale.a.quantized.scale_inv = &host_scalars[0];
  EXPECT_QMESH_ERROR(gemm(host_scale), "a.scale_inv must point to an fp32 scalar in the memory");
  Tensor d8(kE4, Shape{32, 48}, dev);
  Tensor dscal(kF32, Shape{2}, dev);
  GemmArgs fp8_out = args;
  fp8_out.d = d8.view();
  fp8_out.d_scale = dscal.data_as<float>();
  fp8_out.d_amax = &host_scalars[1];
  EXPECT_QMESH_ERROR(gemm(fp8_out), "d_amax must point to an fp32 scalar in the memory");
  fp8_out.d_scale = &host_scalars[0];
  fp8_out.d_amax = nullptr;
  EXPECT_QMESH_ERROR(gemm(fp8_out), "d_scale must point to an fp32 scalar in the memory");

  // The GELU aux matrix's leading dimension (N) must be a multiple of 8.
  const Matrix p = random_matrix(kBf16, 16, 32, 3), q = random_matrix(kBf16, 12, 32, 4);
  DeviceMatrix p_d(p, dev), q_d(q, dev);
  Tensor d12(kBf16, Shape{16, 12}, dev), aux(kBf16, Shape{16, 12}, dev),
      bias(kBf16, Shape{12}, dev);
  GemmArgs gelu;
  gelu.a = p_d.operand();
  gelu.b = q_d.operand();
  gelu.d = d12.view();
  gelu.epilogue = GemmEpilogue::kBiasGeluAux;
  gelu.bias = bias.view();
  gelu.aux = aux.view();
  EXPECT_QMESH_ERROR(gemm(gelu), "leading dimension of aux) to be a multiple of 8, got N = 12");
}

}  // namespace
}  // namespace qmesh::test
