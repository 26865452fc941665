// OperandGather (bulk overlap) on the local backend: the gathered operand is the chunks in
// rank order, byte for byte, with the FP8 scalars, also while other work (here a collective
// GEMM on the same communicator) runs between start and finish; bad arguments and a rank
// that never joins give errors, not hangs.
#include "qmesh/overlap/operand_gather.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "collective_gemm_checks.h"
#include "expect_error.h"
#include "qmesh/comm/local.h"

namespace qmesh {
namespace {

using namespace testing_overlap;

class OperandGatherTest : public ::testing::TestWithParam<Case> {};

// Rank r holds rows [3r, 3r + 3) of a global [3·tp, 16] operand; the gather must give the
// global operand's bytes (built here from the whole matrix, not by gathering) while a
// GEMM + reduce-scatter runs on the same communicator in between.
TEST_P(OperandGatherTest, GathersTheChunksInRankOrderBesideOtherWork) {
  const Operands kind = GetParam().operands;
  run_local_ranks(GetParam().tp, [kind](Communicator& comm) {
    const int tp = comm.size();
    const int64_t chunk = 3, k = 16, tokens = chunk * tp;
    const std::vector<float> x = normal_matrix(21, tokens, k);
    const Operand full(kind, x.data(), tokens, k, DType::kFloat8E4M3);
    const Operand mine(kind, x.data() + comm.rank() * chunk * k, chunk, k, DType::kFloat8E4M3);
    const Gathered gathered(kind, tokens, k);
    // Work beside the gather: a GEMM + reduce-scatter ring (fp32, [2·tp, 8] x [4, 8]ᵀ).
    const std::vector<float> a_values = normal_matrix(22 + uint64_t(comm.rank()), 2 * tp, 8);
    const std::vector<float> b_values = normal_matrix(40, 4, 8);
    const Operand a(Operands::kFp32, a_values.data(), 2 * tp, 8, DType::kFloat8E4M3);
    const Operand b(Operands::kFp32, b_values.data(), 4, 8, DType::kFloat8E4M3);
    Tensor d(DType::kFloat32, Shape{2, 4});
    GemmArgs rs;
    rs.a = a.op();
    rs.b = b.op();
    rs.d = d;

    OperandGather gather(comm, mine.op(), gathered.op(), {});
    gemm_reduce_scatter(comm, rs, Overlap::kRing);
    gather.finish();
    gather.finish();  // a second call returns at once

    const void* want = kind == Operands::kFp8 ? full.fp8.data().data() : full.plain.data();
    EXPECT_EQ(std::memcmp(gathered.bytes(), want, gathered.nbytes()), 0) << "gathered bytes";
    if (kind == Operands::kFp8) {
      const QuantizedTensorView g = gathered.fp8.view(), m = mine.fp8.view();
      EXPECT_EQ(*g.scale, *m.scale);
      EXPECT_EQ(*g.scale_inv, *m.scale_inv);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Kinds, OperandGatherTest, ::testing::ValuesIn(cases_for({1, 2, 3, 4})),
                         case_name);

TEST(OperandGather, BadArgumentsAreErrors) {
  run_local_ranks(2, [](Communicator& comm) {
    Tensor chunk(DType::kFloat32, Shape{4, 8});
    Tensor small(DType::kFloat32, Shape{4, 8}), bf16(DType::kBFloat16, Shape{8, 8});
    EXPECT_QMESH_ERROR(
        OperandGather(comm, GemmOperand::plain(chunk), GemmOperand::plain(small), {}),
        "gathered must be [8, 8] (tp=2 chunks of [4, 8])");
    EXPECT_QMESH_ERROR(OperandGather(comm, GemmOperand::plain(chunk), GemmOperand::plain(bf16), {}),
                       "gathered must be of the chunk's kind and dtype fp32");
    Tensor both(DType::kFloat32, Shape{8, 8});
    const TensorView inside(both.data(), DType::kFloat32, Shape{4, 8});
    EXPECT_QMESH_ERROR(
        OperandGather(comm, GemmOperand::plain(inside), GemmOperand::plain(both), {}),
        "must not overlap the gathered storage");
    const TensorView on_gpu(chunk.data(), DType::kFloat32, Shape{4, 8}, Device::cuda(0));
    EXPECT_QMESH_ERROR(
        OperandGather(comm, GemmOperand::plain(on_gpu), GemmOperand::plain(both), {}),
        "on cuda:0 and gathered on host");
  });
}

// A rank that never joins: finish() fails after QMESH_COMM_TIMEOUT_S on the others, and a
// gather dropped unfinished while unwinding from another error does not wait again.
TEST(OperandGather, AMissingPeerIsATimeoutError) {
  setenv("QMESH_COMM_TIMEOUT_S", "1", 1);
  const auto start = std::chrono::steady_clock::now();
  auto without_rank_1 = [](Communicator& comm) {
    if (comm.rank() == 1) return;  // the dead peer
    Tensor chunk(DType::kFloat32, Shape{2, 4}), gathered(DType::kFloat32, Shape{6, 4});
    OperandGather gather(comm, GemmOperand::plain(chunk), GemmOperand::plain(gathered), {});
    gather.finish();
  };
  EXPECT_QMESH_ERROR(run_local_ranks(3, without_rank_1), "OperandGather (rank");
  auto unwinding = [](Communicator& comm) {
    if (comm.rank() == 1) return;
    Tensor chunk(DType::kFloat32, Shape{2, 4}), gathered(DType::kFloat32, Shape{6, 4});
    OperandGather gather(comm, GemmOperand::plain(chunk), GemmOperand::plain(gathered), {});
    QMESH_THROW("the GEMM beside the gather failed");
  };
  EXPECT_QMESH_ERROR(run_local_ranks(3, unwinding), "the GEMM beside the gather failed");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  unsetenv("QMESH_COMM_TIMEOUT_S");
}

}  // namespace
}  // namespace qmesh
