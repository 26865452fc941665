// Checks of the collective GEMMs on CUDA tensors, shared by the local-backend GPU test (tp
// virtual ranks on one GPU) and the NCCL test: on this rank, every schedule gives the same
// bits as the unoverlapped one (Overlap::kNone) on the device, the gathered operand is the
// exact concatenation of the chunks, and the results agree with a float64 host reference
// within docs/numerics.md's GEMM tolerances.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "collective_gemm_checks.h"
#include "qmesh/copy.h"
#include "qmesh/device.h"
#include "qmesh/float16.h"
#include "qmesh/overlap/operand_gather.h"
#include "qmesh/owned_stream.h"

namespace qmesh::testing_overlap {

inline const Device kGpu = Device::cuda(0);

// One rank's compute and comm streams, destroyed with the rank.
class RankStreams {
 public:
  CollectiveGemmStreams get() const { return {compute_.get(), comm_.get()}; }
  // Waits for everything the call enqueued (it is all ordered before the compute stream's
  // later work, so synchronizing that stream is enough).
  void sync() const { synchronize(kGpu, compute_.get()); }

 private:
  OwnedStream compute_{kGpu}, comm_{kGpu};
};

// A device copy of a host test operand (FP8: codes and the three scalars; no columnwise
// copy, since A is read rowwise and B in the TN form).
inline Gathered to_gpu(Operands kind, const Operand& host, int64_t rows, int64_t cols) {
  Gathered d(kind, rows, cols, kGpu);
  d.copy_from(host);
  return d;
}

// An fp32 or bf16 device tensor's values on the host.
inline std::vector<float> to_host_floats(const Tensor& t) {
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

// ‖got − want‖ / ‖want‖ (docs/numerics.md "Tolerances": the robust comparison).
inline double relative_error(const std::vector<float>& got, const double* want) {
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
// all-gather GEMM stores bf16 (2^-9 relative): docs/numerics.md's fp8 1e-2 covers both.
inline double tolerance(Operands kind) { return kind == Operands::kFp8 ? 1e-2 : 1e-5; }

// The bytes a host operand stores (FP8 codes, or the plain values).
inline std::vector<uint8_t> stored_bytes(const Operand& op) {
  const Tensor& t = op.plain.data() ? op.plain : op.fp8.data();
  const auto* p = static_cast<const uint8_t*>(t.data());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

// Skips without a GPU; bounds every host wait of the rings by 60 s (unless the environment
// sets QMESH_COMM_TIMEOUT_S), so that a broken schedule fails soon instead of after 300 s.
inline void gpu_test_setup() {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  setenv("QMESH_COMM_TIMEOUT_S", "60", 0);
}

// Shapes: multiples of 16 in every dimension (cuBLASLt's FP8 leading-dimension rule).
constexpr int64_t kChunk = 32, kK = 64, kN = 48;

// All-gather + GEMM (bias epilogue) of a global [kChunk·tp, kK] x against W [kN, kK].
inline void check_all_gather_gemm_gpu(Communicator& comm, Operands kind) {
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
  const std::vector<uint8_t> full_bytes = stored_bytes(full_a);
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
      EXPECT_EQ(scalars[QuantizedTensor::kScalarSlot], 0.5f) << name << ": gathered scale_inv";
    }
    const std::vector<float> got = to_host_floats(d);
    EXPECT_LE(relative_error(got, want.data()), tolerance(kind)) << name;
    if (unoverlapped.empty())
      unoverlapped = got;
    else
      EXPECT_EQ(std::memcmp(unoverlapped.data(), got.data(), got.size() * sizeof(float)), 0)
          << name << " differs from none on rank " << r;
  }
}

// GEMM + reduce-scatter: rank p holds A_p [kChunk·tp, kK] and B_p [kN, kK]; every schedule gives
// chunk rank() of sum_p A_p · B_pᵀ.
// OperandGather (bulk overlap) on the device: started on the comm stream, a GEMM enqueued on
// the compute stream meanwhile, finished; the gathered operand is then the exact
// concatenation of the chunks, with the chunk's FP8 scale_inv, in the compute stream's order.
inline void check_operand_gather_gpu(Communicator& comm, Operands kind) {
  const int tp = comm.size(), r = comm.rank();
  const int64_t tokens = kChunk * tp;
  const std::vector<float> x = normal_matrix(31, tokens, kK);
  const Operand full(kind, x.data(), tokens, kK, DType::kFloat8E4M3);
  const Operand mine(kind, x.data() + r * kChunk * kK, kChunk, kK, DType::kFloat8E4M3);
  const Gathered chunk = to_gpu(kind, mine, kChunk, kK);
  const Gathered gathered(kind, tokens, kK, kGpu);
  const std::vector<float> w = normal_matrix(32, kN, kK);
  const Operand b(kind, w.data(), kN, kK, DType::kFloat8E4M3);
  const Gathered db = to_gpu(kind, b, kN, kK);
  const Tensor d(kind == Operands::kFp8 ? DType::kBFloat16 : DType::kFloat32, Shape{kChunk, kN},
                 kGpu);
  const RankStreams streams;
  OperandGather gather(comm, chunk.op(), gathered.op(), streams.get());
  GemmArgs beside;  // independent work on the compute stream
  beside.a = chunk.op();
  beside.b = db.op();
  beside.d = d;
  gemm(beside, streams.get().compute);
  gather.finish();
  streams.sync();
  EXPECT_EQ(gathered.host_bytes(), stored_bytes(full)) << "gathered operand";
  if (kind == Operands::kFp8) {
    EXPECT_EQ(to_host_floats(gathered.fp8.scalars())[QuantizedTensor::kScalarSlot], 0.5f)
        << "gathered scale_inv";
  }
}

inline void check_gemm_reduce_scatter_gpu(Communicator& comm, Operands kind) {
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
  const Operand a(kind, normal_matrix(100 + r, tokens, kK).data(), tokens, kK, DType::kFloat8E4M3);
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
}

}  // namespace qmesh::testing_overlap
