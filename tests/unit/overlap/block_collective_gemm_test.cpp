// Collective GEMMs with block-scaled FP8 operands (Float8BlockScaling) on the local backend:
// every schedule gives the bits of Overlap::kNone; the gathered operand is bitwise the block
// cast of the gathered input (codes and scales, in the layout of [T, K]); D agrees with a
// float64 GEMM of the dequantized operands; what cannot be split is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "collective_gemm_checks.h"
#include "expect_error.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/comm/local.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/overlap/operand_gather.h"
#include "qmesh/scaling/recipe.h"

namespace qmesh {
namespace {

using testing_overlap::kSchedules;
using testing_overlap::normal_matrix;

// A host fp32 tensor [rows, cols] from `values` (row-major).
Tensor host_tensor(const float* values, int64_t rows, int64_t cols) {
  Tensor t(DType::kFloat32, Shape{rows, cols});
  std::memcpy(t.data(), values, static_cast<size_t>(rows * cols) * sizeof(float));
  return t;
}

// The block cast of `values` [rows, cols] with TE's default QParams.
BlockQuantizedTensor block_cast(const float* values, int64_t rows, int64_t cols, BlockShape block,
                                bool columnwise) {
  BlockQuantizedTensor q(DType::kFloat8E4M3, Shape{rows, cols}, block, Device::host(), columnwise);
  block_quantize(host_tensor(values, rows, cols), q.view(), Float8BlockScaling{}.fp8_quant_fwd_inp,
                 Stream{});
  return q;
}

// The values a block-scaled GEMM reads from q's rowwise copy.
std::vector<float> dequantized(const BlockQuantizedTensor& q) {
  Tensor out(DType::kFloat32, q.shape());
  BlockQuantizedTensorView rowwise = q.view();
  rowwise.data_t = TensorView();
  rowwise.scale_inv_t = TensorView();
  block_dequantize(rowwise, out, Stream{});
  return std::vector<float>(out.data_as<float>(), out.data_as<float>() + out.numel());
}

// m [rows, cols] transposed.
std::vector<float> transposed(const std::vector<float>& m, int64_t rows, int64_t cols) {
  std::vector<float> t(m.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[size_t(c * rows + r)] = m[size_t(r * cols + c)];
  return t;
}

// Relative norm of got - want.
double relative_error(const float* got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(diff / norm);
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

// all_gather_gemm of x [T, K] (chunk of 6 rows a rank, K = 200: a partial 1x128 block, scale
// rows padded from 6 to 8 a chunk) against W [48, 200] (128x128 tiles), y = gather(x) · Wᵀ.
void check_block_all_gather_gemm(Communicator& comm) {
  const int tp = comm.size(), r = comm.rank();
  const int64_t chunk = 6, tokens = chunk * tp, k = 200, n = 48;
  const std::vector<float> x = normal_matrix(31, tokens, k);
  const std::vector<float> w = normal_matrix(32, n, k);
  const BlockQuantizedTensor full_x = block_cast(x.data(), tokens, k, BlockShape::k1x128, false);
  const BlockQuantizedTensor wq = block_cast(w.data(), n, k, BlockShape::k128x128, false);
  const std::vector<double> want =
      testing_overlap::reference_tn(dequantized(full_x), dequantized(wq), tokens, k, n);
  // This rank's chunk, cast on its own.
  const BlockQuantizedTensor mine =
      block_cast(x.data() + r * chunk * k, chunk, k, BlockShape::k1x128, false);
  Tensor none_d;
  for (Overlap schedule : kSchedules) {
    SCOPED_TRACE(std::string("tp ") + std::to_string(tp) + ", " +
                 std::string(overlap_name(schedule)));
    BlockQuantizedTensor gathered(DType::kFloat8E4M3, Shape{tokens, k}, BlockShape::k1x128,
                                  Device::host(), false);
    Tensor d(DType::kFloat32, Shape{tokens, n});
    GemmArgs args;
    args.a = GemmOperand::fp8_block(mine.view());
    args.b = GemmOperand::fp8_block(wq.view());
    args.d = d;
    args.accumulation = GemmAccumulation::kSplit;
    all_gather_gemm(comm, args, GemmOperand::fp8_block(gathered.view()), schedule);
    EXPECT_TRUE(same_bytes(gathered.data(), full_x.data())) << "gathered codes";
    EXPECT_TRUE(same_bytes(gathered.scale_inv(), full_x.scale_inv())) << "gathered scales";
    EXPECT_LT(relative_error(d.data_as<float>(), want), 1e-5);
    if (schedule == Overlap::kNone)
      none_d = std::move(d);
    else
      EXPECT_TRUE(same_bytes(d, none_d)) << "D differs from none's";
  }
}

// gemm_reduce_scatter as in the dgrad of a column-parallel layer: rank p holds dy_p [T, 160]
// (1x128 blocks) and W_p [160, 136] (128x128 tiles, read through its columnwise copy:
// trans_b kNo); D = chunk rank() of sum_p dy_p · W_p.
void check_block_gemm_reduce_scatter(Communicator& comm) {
  const int tp = comm.size(), r = comm.rank();
  const int64_t chunk = 6, tokens = chunk * tp, k = 160, n = 136;
  std::vector<double> want(static_cast<size_t>(tokens * n), 0.0);
  for (int p = 0; p < tp; ++p) {
    const std::vector<float> a = normal_matrix(300 + p, tokens, k);
    const std::vector<float> b = normal_matrix(400 + p, k, n);
    const std::vector<double> part = testing_overlap::reference_tn(
        dequantized(block_cast(a.data(), tokens, k, BlockShape::k1x128, false)),
        transposed(dequantized(block_cast(b.data(), k, n, BlockShape::k128x128, false)), k, n),
        tokens, k, n);
    for (size_t i = 0; i < want.size(); ++i) want[i] += part[i];
  }
  const std::vector<double> want_mine(want.begin() + r * chunk * n,
                                      want.begin() + (r + 1) * chunk * n);
  const std::vector<float> a = normal_matrix(300 + r, tokens, k);
  const std::vector<float> b = normal_matrix(400 + r, k, n);
  const BlockQuantizedTensor aq = block_cast(a.data(), tokens, k, BlockShape::k1x128, true);
  const BlockQuantizedTensor bq = block_cast(b.data(), k, n, BlockShape::k128x128, true);
  Tensor none_d;
  for (Overlap schedule : kSchedules) {
    SCOPED_TRACE(std::string("tp ") + std::to_string(tp) + ", " +
                 std::string(overlap_name(schedule)));
    Tensor d(DType::kFloat32, Shape{chunk, n});
    GemmArgs args;
    args.a = GemmOperand::fp8_block(aq.view());
    args.b = GemmOperand::fp8_block(bq.view());
    args.trans_b = GemmTranspose::kNo;
    args.d = d;
    args.accumulation = GemmAccumulation::kSplit;
    gemm_reduce_scatter(comm, args, schedule);
    EXPECT_LT(relative_error(d.data_as<float>(), want_mine), 1e-5);
    if (schedule == Overlap::kNone)
      none_d = std::move(d);
    else
      EXPECT_TRUE(same_bytes(d, none_d)) << "D differs from none's";
  }
}

TEST(BlockCollectiveGemm, AllGatherGemmGathersTheBlockCastAndMatchesFloat64) {
  for (int tp : {1, 2, 3, 4}) run_local_ranks(tp, check_block_all_gather_gemm);
}

TEST(BlockCollectiveGemm, GemmReduceScatterMatchesFloat64) {
  for (int tp : {1, 2, 3, 4}) run_local_ranks(tp, check_block_gemm_reduce_scatter);
}

TEST(BlockCollectiveGemm, WhatCannotBeSplitIsRefused) {
  run_local_ranks(2, [](Communicator& comm) {
    const Device host = Device::host();
    BlockQuantizedTensor tiles(DType::kFloat8E4M3, Shape{4, 128}, BlockShape::k128x128, host,
                               false);
    BlockQuantizedTensor a(DType::kFloat8E4M3, Shape{4, 128}, BlockShape::k1x128, host, false);
    BlockQuantizedTensor b(DType::kFloat8E4M3, Shape{16, 128}, BlockShape::k128x128, host, false);
    BlockQuantizedTensor gathered(DType::kFloat8E4M3, Shape{8, 128}, BlockShape::k1x128, host,
                                  false);
    BlockQuantizedTensor gathered_t(DType::kFloat8E4M3, Shape{8, 128}, BlockShape::k1x128, host,
                                    true);
    Tensor d(DType::kFloat32, Shape{8, 16}), d_rs(DType::kFloat32, Shape{2, 16});
    GemmArgs args;
    args.a = GemmOperand::fp8_block(tiles.view());
    args.b = GemmOperand::fp8_block(b.view());
    args.d = d;
    EXPECT_QMESH_ERROR(
        all_gather_gemm(comm, args, GemmOperand::fp8_block(gathered.view()), Overlap::kRing),
        "a block-scaled A must have 1x128 blocks");
    args.a = GemmOperand::fp8_block(a.view());
    EXPECT_QMESH_ERROR(
        all_gather_gemm(comm, args, GemmOperand::fp8_block(gathered_t.view()), Overlap::kRing),
        "must not have a columnwise copy");
    EXPECT_QMESH_ERROR(
        all_gather_gemm(comm, args, GemmOperand::fp8_block(tiles.view()), Overlap::kRing),
        "gathered must be of A's kind and dtype 1x128-block-scaled FP8");
    args.a = GemmOperand::fp8_block(tiles.view());
    args.d = d_rs;
    EXPECT_QMESH_ERROR(gemm_reduce_scatter(comm, args, Overlap::kRing),
                       "a block-scaled A must have 1x128 blocks");
    EXPECT_QMESH_ERROR(OperandGather(comm, GemmOperand::fp8_block(a.view()),
                                     GemmOperand::fp8_block(gathered.view()), {}),
                       "block-scaled operands are gathered by all_gather_gemm");
  });
}

}  // namespace
}  // namespace qmesh
