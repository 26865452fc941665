// The collective GEMMs on CUDA tensors: tp virtual ranks (threads of the local backend) share
// the one GPU, each with its own compute and comm streams. On the device, every
// schedule gives the same bits as the unoverlapped one (Overlap::kNone), the gathered operand
// is the exact concatenation of the chunks, and the results agree with a float64 host
// reference within docs/numerics.md's GEMM tolerances; bad arguments give errors. Skipped without a
// GPU.
#include <gtest/gtest.h>

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
