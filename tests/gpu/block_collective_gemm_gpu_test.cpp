// The collective GEMMs with block-scaled operands on CUDA tensors (tp virtual ranks of the
// local backend on one GPU): the gathered operand is byte for byte the host's (codes and
// 1x128 scales in the layout of [T, K]), every schedule gives the bits of Overlap::kNone, and
// D agrees with the host collective GEMM within the block-scaled GEMM's CUDA tolerance
// (docs/design/block_scaling.md "CUDA backend": max(2 · D's unit roundoff, 4 · 2^-14)).
// Skipped without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "collective_gemm_gpu_checks.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/comm/local.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/scaling/recipe.h"

namespace qmesh {
namespace {

using namespace testing_overlap;

// Chunks of 32 tokens (1x128 A: a multiple of 8), K and N multiples of 16, K with a partial
// block.
constexpr int64_t kChunk = 32, kK = 192, kN = 64;
constexpr double kTolerance = 4.0 / 16384;  // fp32 D

// The block cast of host `values` [rows, cols] (TE's default QParams), on the host and a copy
// of it on the GPU (codes and scales of both copies).
struct BlockPair {
  BlockQuantizedTensor host, gpu;
  BlockPair(const float* values, int64_t rows, int64_t cols, BlockShape block, bool columnwise)
      : host(DType::kFloat8E4M3, Shape{rows, cols}, block, Device::host(), columnwise),
        gpu(DType::kFloat8E4M3, Shape{rows, cols}, block, kGpu, columnwise) {
    Tensor x(DType::kFloat32, Shape{rows, cols});
    std::memcpy(x.data(), values, static_cast<size_t>(x.nbytes()));
    block_quantize(x, host.view(), Float8BlockScaling{}.fp8_quant_fwd_inp, Stream{});
    copy_tensor(gpu.data(), host.data());
    copy_tensor(gpu.scale_inv(), host.scale_inv());
    if (columnwise) {
      copy_tensor(gpu.data_t(), host.data_t());
      copy_tensor(gpu.scale_inv_t(), host.scale_inv_t());
    }
  }
};

std::vector<uint8_t> host_bytes(const Tensor& t) {
  std::vector<uint8_t> out(static_cast<size_t>(t.nbytes()));
  copy_bytes(out.data(), Device::host(), t.data(), t.device(), out.size());
  return out;
}

// Checks D of each schedule in turn: within kTolerance of the host's D, and the bits of the
// first schedule's (Overlap::kNone).
class DChecker {
 public:
  explicit DChecker(const Tensor& host_d)
      : want_(host_d.data_as<float>(), host_d.data_as<float>() + host_d.numel()) {}
  void check(const Tensor& d, int rank) {
    EXPECT_LE(relative_error(to_host_floats(d), want_.data()), kTolerance);
    if (none_.empty())
      none_ = host_bytes(d);
    else
      EXPECT_EQ(host_bytes(d), none_) << "differs from none on rank " << rank;
  }

 private:
  std::vector<double> want_;
  std::vector<uint8_t> none_;
};

GemmArgs block_args(const BlockQuantizedTensor& a, const BlockQuantizedTensor& b,
                    GemmTranspose trans_b, const Tensor& d) {
  GemmArgs args;
  args.a = GemmOperand::fp8_block(a.view());
  args.b = GemmOperand::fp8_block(b.view());
  args.trans_b = trans_b;
  args.d = d;
  args.accumulation = GemmAccumulation::kSplit;
  return args;
}

class BlockCollectiveGemmGpu : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { gpu_test_setup(); }
};

TEST_P(BlockCollectiveGemmGpu, AllGatherGemmMatchesTheHost) {
  run_local_ranks(GetParam(), [](Communicator& comm) {
    const int tp = comm.size(), r = comm.rank();
    const int64_t tokens = kChunk * tp;
    const std::vector<float> x = normal_matrix(41, tokens, kK), w = normal_matrix(42, kN, kK);
    const BlockPair a(x.data() + r * kChunk * kK, kChunk, kK, BlockShape::k1x128, false);
    const BlockPair b(w.data(), kN, kK, BlockShape::k128x128, false);
    // The host collective GEMM: the reference.
    BlockQuantizedTensor host_gathered(DType::kFloat8E4M3, Shape{tokens, kK}, BlockShape::k1x128,
                                       Device::host(), false);
    Tensor host_d(DType::kFloat32, Shape{tokens, kN});
    all_gather_gemm(comm, block_args(a.host, b.host, GemmTranspose::kYes, host_d),
                    GemmOperand::fp8_block(host_gathered.view()), Overlap::kNone);
    DChecker check_d(host_d);
    const RankStreams streams;
    for (Overlap schedule : kSchedules) {
      SCOPED_TRACE(std::string(overlap_name(schedule)));
      BlockQuantizedTensor gathered(DType::kFloat8E4M3, Shape{tokens, kK}, BlockShape::k1x128, kGpu,
                                    false);
      const Tensor d(DType::kFloat32, Shape{tokens, kN}, kGpu);
      all_gather_gemm(comm, block_args(a.gpu, b.gpu, GemmTranspose::kYes, d),
                      GemmOperand::fp8_block(gathered.view()), schedule, streams.get());
      streams.sync();
      EXPECT_EQ(host_bytes(gathered.data()), host_bytes(host_gathered.data())) << "codes";
      EXPECT_EQ(host_bytes(gathered.scale_inv()), host_bytes(host_gathered.scale_inv()))
          << "scales";
      check_d.check(d, r);
    }
  });
}

TEST_P(BlockCollectiveGemmGpu, GemmReduceScatterMatchesTheHost) {
  run_local_ranks(GetParam(), [](Communicator& comm) {
    const int tp = comm.size(), r = comm.rank();
    const int64_t tokens = kChunk * tp;
    // dgrad of a column-parallel layer: dy [T, kK] (1x128) times W [kK, kN] (tiles, read
    // through its columnwise copy).
    const std::vector<float> dy = normal_matrix(50 + uint64_t(r), tokens, kK);
    const std::vector<float> w = normal_matrix(60 + uint64_t(r), kK, kN);
    const BlockPair a(dy.data(), tokens, kK, BlockShape::k1x128, false);
    const BlockPair b(w.data(), kK, kN, BlockShape::k128x128, true);
    Tensor host_d(DType::kFloat32, Shape{kChunk, kN});
    gemm_reduce_scatter(comm, block_args(a.host, b.host, GemmTranspose::kNo, host_d),
                        Overlap::kNone);
    DChecker check_d(host_d);
    const RankStreams streams;
    for (Overlap schedule : kSchedules) {
      SCOPED_TRACE(std::string(overlap_name(schedule)));
      const Tensor d(DType::kFloat32, Shape{kChunk, kN}, kGpu);
      gemm_reduce_scatter(comm, block_args(a.gpu, b.gpu, GemmTranspose::kNo, d), schedule,
                          streams.get());
      streams.sync();
      check_d.check(d, r);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, BlockCollectiveGemmGpu, ::testing::Values(1, 2, 4),
                         [](const auto& p) { return "tp" + std::to_string(p.param); });

}  // namespace
}  // namespace qmesh
