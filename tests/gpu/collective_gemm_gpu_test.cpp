// The collective GEMMs on CUDA tensors: tp virtual ranks (threads of the local backend) share
// the one GPU, each with its own compute and comm streams. On the device, every
// schedule gives the same bits as the unoverlapped one (Overlap::kNone), the gathered operand
// is the exact concatenation of the chunks, and the results agree with a float64 host
// reference within docs/numerics.md's GEMM tolerances; bad arguments give errors. Skipped without a
// GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "collective_gemm_gpu_checks.h"
#include "expect_error.h"
#include "qmesh/comm/local.h"

namespace qmesh {
namespace {

using namespace testing_overlap;

class CollectiveGemmGpu : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { gpu_test_setup(); }
};

TEST_P(CollectiveGemmGpu, AllGatherGemmIsBitwiseEqualToUnoverlapped) {
  const Operands kind = GetParam().operands;
  run_local_ranks(GetParam().tp,
                  [kind](Communicator& comm) { check_all_gather_gemm_gpu(comm, kind); });
}

TEST_P(CollectiveGemmGpu, OperandGatherIsExact) {
  const Operands kind = GetParam().operands;
  run_local_ranks(GetParam().tp,
                  [kind](Communicator& comm) { check_operand_gather_gpu(comm, kind); });
}

TEST_P(CollectiveGemmGpu, GemmReduceScatterIsBitwiseEqualToUnoverlapped) {
  const Operands kind = GetParam().operands;
  run_local_ranks(GetParam().tp,
                  [kind](Communicator& comm) { check_gemm_reduce_scatter_gpu(comm, kind); });
}

INSTANTIATE_TEST_SUITE_P(Schedules, CollectiveGemmGpu, ::testing::ValuesIn(cases_for({1, 2, 3, 4})),
                         case_name);

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
                       "both must be on one device");
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

// FP8 scale_inv that differ between ranks: on CUDA the check runs on the device (no host
// wait), and D comes back as NaN on every rank and for every schedule.
TEST_F(CollectiveGemmGpuErrors, Fp8ScalesThatDifferFillDWithNaN) {
  run_local_ranks(2, [](Communicator& comm) {
    const std::vector<float> v = normal_matrix(1, kChunk, kK);
    const std::vector<float> w = normal_matrix(2, kN, kK);
    const Operand a(Operands::kFp8, v.data(), kChunk, kK, DType::kFloat8E4M3);
    const Operand b(Operands::kFp8, w.data(), kN, kK, DType::kFloat8E4M3);
    const Gathered da = to_gpu(Operands::kFp8, a, kChunk, kK);
    const Gathered db = to_gpu(Operands::kFp8, b, kN, kK);
    const float other = comm.rank() == 0 ? 0.5f : 0.25f;
    copy_bytes(da.fp8.view().scale_inv, kGpu, &other, Device::host(), sizeof(float));
    const RankStreams streams;
    for (Overlap schedule : kSchedules) {
      const Gathered gathered(Operands::kFp8, kChunk * 2, kK, kGpu);
      const Tensor d(DType::kFloat32, Shape{kChunk * 2, kN}, kGpu);
      GemmArgs args;
      args.a = da.op();
      args.b = db.op();
      args.d = d;
      all_gather_gemm(comm, args, gathered.op(), schedule, streams.get());
      streams.sync();
      for (float x : to_host_floats(d))
        ASSERT_TRUE(std::isnan(x)) << overlap_name(schedule) << ": D must be NaN";
    }
  });
}

// An FP8 D's amax is the max over every chunk's, on the device too (the largest values sit
// in one chunk, which is not the last one computed on every rank).
TEST_F(CollectiveGemmGpuErrors, Fp8OutputAmaxIsTheMaxOverEveryChunk) {
  run_local_ranks(3, [](Communicator& comm) {
    const int64_t tokens = kChunk * 3;
    std::vector<float> x(static_cast<size_t>(tokens * kK), 0.25f);
    for (int64_t i = 0; i < kK; ++i) x[static_cast<size_t>(i)] = 3.0f;  // chunk 0's first row
    const std::vector<float> w(static_cast<size_t>(kN * kK), 0.5f);
    const Operand full_a(Operands::kFp8, x.data(), tokens, kK, DType::kFloat8E4M3);
    const Operand b(Operands::kFp8, w.data(), kN, kK, DType::kFloat8E4M3);
    double want = 0;
    for (double v : reference_tn(full_a.seen, b.seen, tokens, kK, kN))
      want = std::max(want, std::abs(v));
    const Operand a(Operands::kFp8, x.data() + comm.rank() * kChunk * kK, kChunk, kK,
                    DType::kFloat8E4M3);
    const Gathered da = to_gpu(Operands::kFp8, a, kChunk, kK);
    const Gathered db = to_gpu(Operands::kFp8, b, kN, kK);
    const RankStreams streams;
    for (Overlap schedule : kSchedules) {
      const Gathered gathered(Operands::kFp8, tokens, kK, kGpu);
      const Tensor d(DType::kFloat8E4M3, Shape{tokens, kN}, kGpu);
      const Tensor scalars(DType::kFloat32, Shape{2}, kGpu);  // d_scale, d_amax
      const float init[2] = {1.0f, -1.0f};
      copy_bytes(scalars.data(), kGpu, init, Device::host(), sizeof(init));
      GemmArgs args;
      args.a = da.op();
      args.b = db.op();
      args.d = d;
      args.d_scale = scalars.data_as<float>();
      args.d_amax = scalars.data_as<float>() + 1;
      all_gather_gemm(comm, args, gathered.op(), schedule, streams.get());
      streams.sync();
      EXPECT_EQ(double(to_host_floats(scalars)[1]), want)
          << overlap_name(schedule) << ", rank " << comm.rank();
    }
  });
}

}  // namespace
}  // namespace qmesh
