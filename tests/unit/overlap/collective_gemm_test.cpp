// All-gather + GEMM and GEMM + reduce-scatter on the local backend: every schedule gives the
// same bits as the unoverlapped one (Overlap::kNone), and all agree with a float64
// reference; bad shapes and a rank that never joins give errors, not hangs.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "collective_gemm_checks.h"
#include "expect_error.h"
#include "qmesh/comm/local.h"

namespace qmesh {
namespace {

using namespace testing_overlap;

class CollectiveGemmTest : public ::testing::TestWithParam<Case> {};

TEST_P(CollectiveGemmTest, AllGatherGemmIsBitwiseEqualToUnoverlapped) {
  const Operands kind = GetParam().operands;
  run_local_ranks(GetParam().tp, [kind](Communicator& comm) { check_all_gather_gemm(comm, kind); });
}

TEST_P(CollectiveGemmTest, GemmReduceScatterIsBitwiseEqualToUnoverlapped) {
  const Operands kind = GetParam().operands;
  run_local_ranks(GetParam().tp,
                  [kind](Communicator& comm) { check_gemm_reduce_scatter(comm, kind); });
}

INSTANTIATE_TEST_SUITE_P(Schedules, CollectiveGemmTest,
                         ::testing::ValuesIn(cases_for({1, 2, 3, 4, 8})), case_name);

TEST(CollectiveGemm, OverlapNamesRoundTrip) {
  for (Overlap o : kSchedules) EXPECT_EQ(parse_overlap(overlap_name(o)), o);
  EXPECT_QMESH_ERROR(parse_overlap("both"), "expected one of: none, ring, bidir");
}

TEST(CollectiveGemm, BadShapesAreErrors) {
  run_local_ranks(2, [](Communicator& comm) {
    Tensor a(DType::kFloat32, Shape{4, 8}), b(DType::kFloat32, Shape{6, 8});
    Tensor d(DType::kFloat32, Shape{8, 6}), gathered(DType::kFloat32, Shape{8, 8});
    GemmArgs args;
    args.a = GemmOperand::plain(a);
    args.b = GemmOperand::plain(b);
    args.d = d;
    Tensor short_d(DType::kFloat32, Shape{4, 6});
    args.d = short_d;
    EXPECT_QMESH_ERROR(all_gather_gemm(comm, args, GemmOperand::plain(gathered), Overlap::kRing),
                       "D must have 8 rows");
    args.d = d;
    Tensor small_gathered(DType::kFloat32, Shape{4, 8});
    EXPECT_QMESH_ERROR(
        all_gather_gemm(comm, args, GemmOperand::plain(small_gathered), Overlap::kRing),
        "gathered must be [8, 8]");
    Tensor b_k(DType::kFloat32, Shape{6, 7});  // K mismatch
    args.b = GemmOperand::plain(b_k);
    EXPECT_QMESH_ERROR(all_gather_gemm(comm, args, GemmOperand::plain(gathered), Overlap::kRing),
                       "all_gather_gemm: GEMM inner dimensions differ");
    // GEMM + RS: 5 tokens over tp=2.
    Tensor a5(DType::kFloat32, Shape{5, 8}), d2(DType::kFloat32, Shape{2, 6});
    GemmArgs rs;
    rs.a = GemmOperand::plain(a5);
    rs.b = GemmOperand::plain(b);
    rs.d = d2;
    EXPECT_QMESH_ERROR(gemm_reduce_scatter(comm, rs, Overlap::kRing),
                       "5 tokens (rows of A [5, 8]) are not divisible by tp=2");
    rs.a = GemmOperand::plain(a);
    rs.d = d;
    EXPECT_QMESH_ERROR(gemm_reduce_scatter(comm, rs, Overlap::kRing), "D must have 2 rows");
    rs.d = Tensor(DType::kFloat32, Shape{2, 6});
    rs.epilogue = GemmEpilogue::kBias;
    EXPECT_QMESH_ERROR(gemm_reduce_scatter(comm, rs, Overlap::kRing), "add the bias after");
  });
}

TEST(CollectiveGemm, Fp8ScalesThatDifferAreAnError) {
  EXPECT_QMESH_ERROR(
      run_local_ranks(2,
                      [](Communicator& comm) {
                        const std::vector<float> v = normal_matrix(1, 2, 16);
                        Operand a(Operands::kFp8, v.data(), 2, 16, DType::kFloat8E4M3);
                        *a.fp8.view().scale_inv = comm.rank() == 0 ? 0.5f : 0.25f;
                        const Operand b(Operands::kFp8, v.data(), 2, 16, DType::kFloat8E4M3);
                        Gathered g(Operands::kFp8, 4, 16);
                        Tensor d(DType::kFloat32, Shape{4, 2});
                        GemmArgs args;
                        args.a = a.op();
                        args.b = b.op();
                        args.d = d;
                        all_gather_gemm(comm, args, g.op(), Overlap::kRing);
                      }),
      "reduce the amax over the tensor-parallel group");
}

// An FP8 D's amax is the amax of the whole D (docs/numerics.md "FP8 GEMM output amax"),
// not the amax of whichever chunk was computed last: the largest |value| of D is placed in
// each chunk in turn, and every rank and schedule must report it. The expected amax is the
// float64 max of |A · Bᵀ| over the values the GEMM sees.
TEST(CollectiveGemm, Fp8OutputAmaxIsTheMaxOverEveryChunk) {
  for (int tp : {2, 3, 4}) {
    for (int big_chunk = 0; big_chunk < tp; ++big_chunk) {
      run_local_ranks(tp, [tp, big_chunk](Communicator& comm) {
        const int64_t chunk = 2, k = 16, n = 16, tokens = chunk * tp;
        std::vector<float> x(static_cast<size_t>(tokens * k), 0.25f);
        for (int64_t i = 0; i < k; ++i) x[big_chunk * chunk * k + i] = 3.0f;  // one big row
        const std::vector<float> w(static_cast<size_t>(n * k), 0.5f);
        const Operand b(Operands::kFp8, w.data(), n, k, DType::kFloat8E4M3);
        const Operand full_a(Operands::kFp8, x.data(), tokens, k, DType::kFloat8E4M3);
        double want = 0;
        for (double v : reference_tn(full_a.seen, b.seen, tokens, k, n))
          want = std::max(want, std::abs(v));
        const Operand a(Operands::kFp8, x.data() + comm.rank() * chunk * k, chunk, k,
                        DType::kFloat8E4M3);
        for (Overlap schedule : kSchedules) {
          Gathered gathered(Operands::kFp8, tokens, k);
          Tensor d(DType::kFloat8E4M3, Shape{tokens, n});
          float d_scale = 1.0f, d_amax = -1.0f;
          GemmArgs args;
          args.a = a.op();
          args.b = b.op();
          args.d = d;
          args.d_scale = &d_scale;
          args.d_amax = &d_amax;
          all_gather_gemm(comm, args, gathered.op(), schedule);
          EXPECT_EQ(double(d_amax), want)
              << "tp " << tp << ", large values in chunk " << big_chunk << ", rank " << comm.rank()
              << ", " << overlap_name(schedule);
        }
      });
    }
  }
}

// Zero-filled fp32 operands of a GEMM D [d_rows, 4] = A [a_rows, 8] · Bᵀ, B [4, 8].
struct Fp32Gemm {
  Tensor a, b, d;
  GemmArgs args;
  Fp32Gemm(int64_t a_rows, int64_t d_rows)
      : a(DType::kFloat32, Shape{a_rows, 8}),
        b(DType::kFloat32, Shape{4, 8}),
        d(DType::kFloat32, Shape{d_rows, 4}) {
    for (Tensor* t : {&a, &b, &d}) std::memset(t->data(), 0, t->nbytes());
    args.a = GemmOperand::plain(a);
    args.b = GemmOperand::plain(b);
    args.d = d;
  }
};

// A rank that never joins the ring: the others fail after the communicator's timeout (set
// in code, far below QMESH_COMM_TIMEOUT_S), no hang.
TEST(CollectiveGemm, AMissingPeerIsATimeoutError) {
  setenv("QMESH_COMM_TIMEOUT_S", "300", 1);
  for (Overlap o : {Overlap::kRing, Overlap::kBidirectional}) {
    const auto start = std::chrono::steady_clock::now();
    auto all_gather_without_rank_2 = [o](Communicator& comm) {
      if (comm.rank() == 2) return;  // the dead peer
      comm.set_timeout(std::chrono::milliseconds(500));
      Fp32Gemm g(2, 6);
      Tensor gathered(DType::kFloat32, Shape{6, 8});
      all_gather_gemm(comm, g.args, GemmOperand::plain(gathered), o);
    };
    EXPECT_QMESH_ERROR(run_local_ranks(3, all_gather_without_rank_2), "all_gather_gemm (rank");
    auto reduce_scatter_without_rank_0 = [o](Communicator& comm) {
      if (comm.rank() == 0) return;
      comm.set_timeout(std::chrono::milliseconds(500));
      Fp32Gemm g(6, 2);
      gemm_reduce_scatter(comm, g.args, o);
    };
    EXPECT_QMESH_ERROR(run_local_ranks(3, reduce_scatter_without_rank_0),
                       "(the communicator's timeout)");
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  }
  unsetenv("QMESH_COMM_TIMEOUT_S");
}

}  // namespace
}  // namespace qmesh
