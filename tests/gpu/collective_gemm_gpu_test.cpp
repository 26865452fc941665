// The collective GEMMs on CUDA tensors: tp virtual ranks (threads of the local backend) share
// the one GPU, each with its own compute and comm streams. On the device, every
// schedule gives the same bits as the unoverlapped one (Overlap::kNone), the gathered operand
// is the exact concatenation of the chunks, and the results agree with a float64 host
// reference within NUMERICS.md's GEMM tolerances; bad arguments give errors. Skipped without a
// GPU.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "collective_gemm_checks.h"
#include "expect_error.h"
#include "qmesh/comm/local.h"
#include "qmesh/copy.h"
#include "qmesh/device.h"
#include "qmesh/float16.h"

namespace qmesh {
namespace {

using namespace testing_overlap;

const Device kGpu = Device::cuda(0);

// One rank's compute and comm streams, destroyed with the rank.
class RankStreams {
 public:
  RankStreams() {
    for (cudaStream_t& s : streams_) EXPECT_EQ(cudaStreamCreate(&s), cudaSuccess);
  }
  ~RankStreams() {
    for (cudaStream_t s : streams_) cudaStreamDestroy(s);
  }
  RankStreams(const RankStreams&) = delete;
  RankStreams& operator=(const RankStreams&) = delete;
  CollectiveGemmStreams get() const { return {{streams_[0]}, {streams_[1]}}; }
  // Waits for everything the call enqueued (it is all ordered before the compute stream's
  // later work, so synchronizing that stream is enough).
  void sync() const { ASSERT_EQ(cudaStreamSynchronize(streams_[0]), cudaSuccess); }

 private:
  cudaStream_t streams_[2] = {};
};

// A device copy of a host test operand (FP8: codes and the three scalars; no columnwise
// copy, since A is read rowwise and B in the TN form).
Gathered to_gpu(Operands kind, const Operand& host, int64_t rows, int64_t cols) {
  Gathered d(kind, rows, cols, kGpu);
  d.copy_from(host);
  return d;
}

// An fp32 or bf16 device tensor's values on the host.
std::vector<float> to_host_floats(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kBFloat16) {
    std::vector<uint16_t> bits(out.size());
    copy_bytes(bits.data(), Device::host(), t.data(), t.device(), t.nbytes());
    bf16_to_fp32(bits.data(), out.data(), out.size());
  } else {
    copy_bytes(out.data(), Device::host(), t.data(), t.device(), t.nbytes());
  }
  return out;
}

// ‖got − want‖ / ‖want‖ (NUMERICS.md: the robust comparison against float64).
double relative_error(const std::vector<float>& got, const double* want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    diff += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

// CUDA against float64: fp32 and bf16 inputs accumulate exactly-rounded products in fp32
// (no TF32: cuBLASLt's COMPUTE_32F) into an fp32 D, a few fp32 units; FP8 with fast
// accumulation (the GemmArgs default) keeps ~14 mantissa bits between promotions, and its
// all-gather GEMM stores bf16 (2^-9 relative): NUMERICS.md's fp8 1e-2 covers both.
double tolerance(Operands kind) { return kind == Operands::kFp8 ? 1e-2 : 1e-5; }

struct Case {
  int tp;
  Operands operands;
};

// Skips without a GPU; bounds every host wait of the rings by 60 s (unless the environment
// sets QMESH_COMM_TIMEOUT_S), so that a broken schedule fails soon instead of after 300 s.
void gpu_test_setup() {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  setenv("QMESH_COMM_TIMEOUT_S", "60", 0);
}

class CollectiveGemmGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { gpu_test_setup(); }
};

// Shapes: multiples of 16 in every dimension (cuBLASLt's FP8 leading-dimension rule).
constexpr int64_t kChunk = 32, kK = 64, kN = 48;

TEST_P(CollectiveGemmGpu, AllGatherGemmIsBitwiseEqualToUnoverlapped) {
  const Operands kind = GetParam().operands;
  run_local_ranks(GetParam().tp, [kind](Communicator& comm) {
    const int tp = comm.size(), r = comm.rank();
    const int64_t tokens = kChunk * tp;
    const std::vector<float> x = normal_matrix(11, tokens, kK);
    const std::vector<float> w = normal_matrix(12, kN, kK);
    const Operand b(kind, w.data(), kN, kK, DType::kFloat8E4M3);
    const Operand full_a(kind, x.data(), tokens, kK, DType::kFloat8E4M3);
    const Operand a(kind, x.data() + r * kChunk * kK, kChunk, kK, DType::kFloat8E4M3);
    // Bias 0.25·j, exact in bf16. FP8 runs cuBLASLt's usual FP8 form (bf16 D and bias); the
    // plain dtypes write fp32 D with an fp32 bias (a plain GEMM's bias has D's dtype).
    std::vector<double> want = reference_tn(full_a.seen, b.seen, tokens, kK, kN);
    for (int64_t t = 0; t < tokens; ++t)
      for (int64_t j = 0; j < kN; ++j) want[static_cast<size_t>(t * kN + j)] += 0.25 * double(j);
    std::vector<float> bias_values(static_cast<size_t>(kN));
    for (int64_t j = 0; j < kN; ++j) bias_values[static_cast<size_t>(j)] = 0.25f * float(j);
    const Operands bias_kind = kind == Operands::kFp8 ? Operands::kBf16 : Operands::kFp32;
    const Operand bias_host(bias_kind, bias_values.data(), 1, kN, DType::kFloat8E4M3);
    const Gathered da = to_gpu(kind, a, kChunk, kK), db = to_gpu(kind, b, kN, kK);
    const Gathered dbias = to_gpu(bias_kind, bias_host, 1, kN);
    const std::vector<uint8_t> full_bytes = [&] {
      const Tensor& t = kind == Operands::kFp8 ? full_a.fp8.data() : full_a.plain;
      const auto* p = static_cast<const uint8_t*>(t.data());
      return std::vector<uint8_t>(p, p + t.nbytes());
    }();
    const RankStreams streams;
    std::vector<float> unoverlapped;
    for (Overlap schedule : kSchedules) {
      const Gathered gathered(kind, tokens, kK, kGpu);
      const Tensor d(kind == Operands::kFp8 ? DType::kBFloat16 : DType::kFloat32, Shape{tokens, kN},
                     kGpu);
      GemmArgs args;
      args.a = da.op();
      args.b = db.op();
      args.d = d;
      args.epilogue = GemmEpilogue::kBias;
      args.bias = TensorView(dbias.plain.data(), dbias.plain.dtype(), Shape{kN}, kGpu);
      all_gather_gemm(comm, args, gathered.op(), schedule, streams.get());
      streams.sync();
      const char* name = overlap_name(schedule).data();
      EXPECT_EQ(gathered.host_bytes(), full_bytes) << name << ": gathered operand";
      if (kind == Operands::kFp8) {
        const std::vector<float> scalars = to_host_floats(gathered.fp8.scalars());
        EXPECT_EQ(scalars[1], 0.5f) << name << ": gathered scale_inv";
      }
      const std::vector<float> got = to_host_floats(d);
      EXPECT_LE(relative_error(got, want.data()), tolerance(kind)) << name;
      if (unoverlapped.empty())
        unoverlapped = got;
      else
        EXPECT_EQ(std::memcmp(unoverlapped.data(), got.data(), got.size() * sizeof(float)), 0)
            << name << " differs from none on rank " << r;
    }
  });
}

TEST_P(CollectiveGemmGpu, GemmReduceScatterIsBitwiseEqualToUnoverlapped) {
  const Operands kind = GetParam().operands;
  run_local_ranks(GetParam().tp, [kind](Communicator& comm) {
    const int tp = comm.size(), r = comm.rank();
    const int64_t tokens = kChunk * tp;
    std::vector<double> want(static_cast<size_t>(tokens * kN), 0.0);
    for (int p = 0; p < tp; ++p) {
      const Operand ap(kind, normal_matrix(100 + p, tokens, kK).data(), tokens, kK,
                       DType::kFloat8E4M3);
      const Operand bp(kind, normal_matrix(200 + p, kN, kK).data(), kN, kK, DType::kFloat8E4M3);
      const std::vector<double> part = reference_tn(ap.seen, bp.seen, tokens, kK, kN);
      for (size_t i = 0; i < want.size(); ++i) want[i] += part[i];
    }
    const Operand a(kind, normal_matrix(100 + r, tokens, kK).data(), tokens, kK,
                    DType::kFloat8E4M3);
    const Operand b(kind, normal_matrix(200 + r, kN, kK).data(), kN, kK, DType::kFloat8E4M3);
    const Gathered da = to_gpu(kind, a, tokens, kK), db = to_gpu(kind, b, kN, kK);
    const RankStreams streams;
    std::vector<float> unoverlapped;
    for (Overlap schedule : kSchedules) {
      const Tensor d(DType::kFloat32, Shape{kChunk, kN}, kGpu);
      GemmArgs args;
      args.a = da.op();
      args.b = db.op();
      args.d = d;
      gemm_reduce_scatter(comm, args, schedule, streams.get());
      streams.sync();
      const char* name = overlap_name(schedule).data();
      const std::vector<float> got = to_host_floats(d);
      EXPECT_LE(relative_error(got, want.data() + r * kChunk * kN), tolerance(kind)) << name;
      if (unoverlapped.empty())
        unoverlapped = got;
      else
        EXPECT_EQ(std::memcmp(unoverlapped.data(), got.data(), got.size() * sizeof(float)), 0)
            << name << " differs from none on rank " << r;
    }
  });
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (int tp : {1, 2, 3, 4})
    for (Operands o : {Operands::kFp32, Operands::kBf16, Operands::kFp8}) out.push_back({tp, o});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Schedules, CollectiveGemmGpu, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& p) {
                           return "tp" + std::to_string(p.param.tp) + "_" +
                                  operands_name(p.param.operands);
                         });

class CollectiveGemmGpuErrors : public ::testing::Test {
 protected:
  void SetUp() override { gpu_test_setup(); }
};

// Every check runs before any transfer, on each rank alike, so no rank is left waiting.
TEST_F(CollectiveGemmGpuErrors, BadArgumentsAreErrors) {
  run_local_ranks(2, [](Communicator& comm) {
    const Tensor a(DType::kFloat32, Shape{16, 32}, kGpu), b(DType::kFloat32, Shape{16, 32}, kGpu);
    const Tensor d(DType::kFloat32, Shape{32, 16}, kGpu);
    const Tensor gathered(DType::kFloat32, Shape{32, 32}, kGpu);
    const RankStreams streams;
    GemmArgs args;
    args.a = GemmOperand::plain(a);
    args.b = GemmOperand::plain(b);
    args.d = d;
    // Streams: missing, or the same stream twice.
    EXPECT_QMESH_ERROR(all_gather_gemm(comm, args, GemmOperand::plain(gathered), Overlap::kRing),
                       "two distinct, non-null streams");
    CollectiveGemmStreams same = streams.get();
    same.comm = same.compute;
    EXPECT_QMESH_ERROR(gemm_reduce_scatter(comm, args, Overlap::kRing, same),
                       "two distinct, non-null streams");
    // gathered of the wrong size, or on the host.
    const Tensor small(DType::kFloat32, Shape{16, 32}, kGpu);
    EXPECT_QMESH_ERROR(
        all_gather_gemm(comm, args, GemmOperand::plain(small), Overlap::kRing, streams.get()),
        "gathered must be [32, 32]");
    const Tensor host_gathered(DType::kFloat32, Shape{32, 32});
    EXPECT_QMESH_ERROR(all_gather_gemm(comm, args, GemmOperand::plain(host_gathered),
                                       Overlap::kBidirectional, streams.get()),
                       "gathered must be on A's device");
    // D on the host while A is on the GPU.
    const Tensor host_d(DType::kFloat32, Shape{32, 16});
    GemmArgs mixed = args;
    mixed.d = host_d;
    EXPECT_QMESH_ERROR(
        all_gather_gemm(comm, mixed, GemmOperand::plain(gathered), Overlap::kNone, streams.get()),
        "live on one device");
    // Reduce-scatter: T = 15 tokens do not divide by tp = 2; D of the wrong height.
    const Tensor a15(DType::kFloat32, Shape{15, 32}, kGpu);
    GemmArgs rs = args;
    rs.a = GemmOperand::plain(a15);
    EXPECT_QMESH_ERROR(gemm_reduce_scatter(comm, rs, Overlap::kRing, streams.get()),
                       "not divisible by tp=2");
    rs.a = GemmOperand::plain(a);
    EXPECT_QMESH_ERROR(gemm_reduce_scatter(comm, rs, Overlap::kRing, streams.get()),
                       "D must have 8 rows");
    comm.barrier();
  });
}

}  // namespace
}  // namespace qmesh
