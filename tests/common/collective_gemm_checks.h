// Checks of the collective GEMMs shared by the unit tests (local backend) and the MPI
// tests: each rank runs every Overlap schedule on the same data and checks that they give
// the same bits and agree with a float64 reference computed here.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/copy.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "qmesh/overlap/collective_gemm.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/random.h"

namespace qmesh::testing_overlap {

enum class Operands { kFp32, kBf16, kFp8 };

inline const char* operands_name(Operands o) {
  return o == Operands::kFp32 ? "fp32" : o == Operands::kBf16 ? "bf16" : "fp8";
}

// A parameterized test's case: tp ranks, one operand precision.
struct Case {
  int tp;
  Operands operands;
};

// Every precision at each of `tps`.
inline std::vector<Case> cases_for(std::initializer_list<int> tps) {
  std::vector<Case> out;
  for (int tp : tps)
    for (Operands o : {Operands::kFp32, Operands::kBf16, Operands::kFp8}) out.push_back({tp, o});
  return out;
}

// "tp2_fp8": a test name suffix for INSTANTIATE_TEST_SUITE_P.
inline std::string case_name(const ::testing::TestParamInfo<Case>& p) {
  return "tp" + std::to_string(p.param.tp) + "_" + operands_name(p.param.operands);
}

// A [rows, cols] matrix of N(0, 1) values, element i from counter_normal(seed, i).
inline std::vector<float> normal_matrix(uint64_t seed, int64_t rows, int64_t cols) {
  std::vector<float> m(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < m.size(); ++i) m[i] = counter_normal(seed, i);
  return m;
}

// One GEMM operand in the chosen precision, with the values the GEMM really sees (rounded
// to bf16, or FP8 codes times scale_inv) kept for the float64 reference.
struct Operand {
  Tensor plain;
  QuantizedTensor fp8;
  std::vector<float> seen;

  Operand(Operands kind, const float* values, int64_t rows, int64_t cols, DType fp8_dtype) {
    const size_t n = static_cast<size_t>(rows * cols);
    seen.assign(values, values + n);
    switch (kind) {
      case Operands::kFp32:
        plain = Tensor(DType::kFloat32, Shape{rows, cols});
        std::memcpy(plain.data(), values, n * sizeof(float));
        break;
      case Operands::kBf16:
        plain = Tensor(DType::kBFloat16, Shape{rows, cols});
        fp32_to_bf16(values, static_cast<uint16_t*>(plain.data()), n);
        bf16_to_fp32(static_cast<uint16_t*>(plain.data()), seen.data(), n);
        break;
      case Operands::kFp8: {
        fp8 = QuantizedTensor(fp8_dtype, Shape{rows, cols}, Device::host(), false);
        const QuantizedTensorView q = fp8.view();
        *q.scale = 2.0f;  // the same on every rank, as the global amax reduction ensures
        *q.scale_inv = 0.5f;
        auto* codes = static_cast<uint8_t*>(q.data.data);
        fp32_to_fp8(values, codes, n, fp8_dtype, *q.scale);
        fp8_to_fp32(codes, seen.data(), n, fp8_dtype, *q.scale_inv);
        break;
      }
    }
  }
  GemmOperand op() const {
    return plain.data() ? GemmOperand::plain(plain) : GemmOperand::fp8(fp8.view());
  }
};

// Storage of A's dtype for a [rows, cols] operand on `device`: the gathered operand, or a
// device copy of an Operand (copy_from).
struct Gathered {
  Tensor plain;
  QuantizedTensor fp8;
  Gathered(Operands kind, int64_t rows, int64_t cols, Device device = Device::host()) {
    if (kind == Operands::kFp8)
      fp8 = QuantizedTensor(DType::kFloat8E4M3, Shape{rows, cols}, device, false);
    else
      plain = Tensor(kind == Operands::kBf16 ? DType::kBFloat16 : DType::kFloat32,
                     Shape{rows, cols}, device);
  }
  GemmOperand op() const {
    return plain.data() ? GemmOperand::plain(plain) : GemmOperand::fp8(fp8.view());
  }
  const Tensor& data() const { return plain.data() ? plain : fp8.data(); }
  const void* bytes() const { return data().data(); }
  size_t nbytes() const { return data().nbytes(); }
  // The stored bytes, copied to the host.
  std::vector<uint8_t> host_bytes() const {
    std::vector<uint8_t> out(nbytes());
    copy_bytes(out.data(), Device::host(), bytes(), data().device(), out.size());
    return out;
  }
  // Copies an operand of the same kind and shape: its values and, for FP8, its scalars.
  void copy_from(const Operand& from) const {
    copy_tensor(data(), from.plain.data() ? from.plain : from.fp8.data());
    if (fp8.data().data()) copy_tensor(fp8.scalars(), from.fp8.scalars());
  }
};

// d[t, n] = sum_k a[t, k] · b[n, k] in float64 (the TN form).
inline std::vector<double> reference_tn(const std::vector<float>& a, const std::vector<float>& b,
                                        int64_t rows, int64_t k, int64_t n) {
  std::vector<double> d(static_cast<size_t>(rows * n), 0.0);
  for (int64_t t = 0; t < rows; ++t)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t i = 0; i < k; ++i) s += double(a[t * k + i]) * double(b[j * k + i]);
      d[t * n + j] = s;
    }
  return d;
}

inline void expect_close(const float* got, const double* want, size_t n, double tol,
                         const char* what) {
  for (size_t i = 0; i < n; ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1.0 + std::abs(want[i]))) << what << " element " << i;
}

inline const Overlap kSchedules[] = {Overlap::kNone, Overlap::kRing, Overlap::kBidirectional};

// All-gather + GEMM (bias epilogue) of a global [5·tp, 24] x against W [12, 24]: on this
// rank, every schedule gathers x exactly, gives D close to float64 and bit-equal to kNone's.
inline void check_all_gather_gemm(Communicator& comm, Operands kind) {
  const int tp = comm.size();
  const int64_t chunk = 5, tokens = chunk * tp, k = 24, n = 12;
  const std::vector<float> x = normal_matrix(11, tokens, k);
  const std::vector<float> w = normal_matrix(12, n, k);
  const Operand b(kind, w.data(), n, k, DType::kFloat8E4M3);
  const Operand full_a(kind, x.data(), tokens, k, DType::kFloat8E4M3);
  std::vector<double> want = reference_tn(full_a.seen, b.seen, tokens, k, n);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < n; ++j) want[t * n + j] += 0.25 * double(j);
  const Operand a(kind, x.data() + comm.rank() * chunk * k, chunk, k, DType::kFloat8E4M3);
  Tensor bias(DType::kFloat32, Shape{n});
  for (int64_t j = 0; j < n; ++j) bias.data_as<float>()[j] = 0.25f * float(j);
  std::vector<float> unoverlapped;
  for (Overlap schedule : kSchedules) {
    Gathered gathered(kind, tokens, k);
    Tensor d(DType::kFloat32, Shape{tokens, n});
    GemmArgs args;
    args.a = a.op();
    args.b = b.op();
    args.d = d;
    args.epilogue = GemmEpilogue::kBias;
    args.bias = bias;
    all_gather_gemm(comm, args, gathered.op(), schedule);
    const void* full_bytes =
        kind == Operands::kFp8 ? full_a.fp8.data().data() : full_a.plain.data();
    ASSERT_EQ(std::memcmp(gathered.bytes(), full_bytes, gathered.nbytes()), 0)
        << overlap_name(schedule) << ": gathered operand";
    expect_close(d.data_as<float>(), want.data(), want.size(), 1e-5, "D");
    if (unoverlapped.empty())
      unoverlapped.assign(d.data_as<float>(), d.data_as<float>() + d.numel());
    else
      EXPECT_EQ(std::memcmp(unoverlapped.data(), d.data(), d.nbytes()), 0)
          << overlap_name(schedule) << " differs from none";
  }
}

// GEMM + reduce-scatter: rank p holds A_p [3·tp, 16] and B_p [10, 16] (as row-parallel
// shards do); every schedule gives chunk rank() of sum_p A_p · B_pᵀ, close to float64 and
// bit-equal to kNone's.
inline void check_gemm_reduce_scatter(Communicator& comm, Operands kind) {
  const int tp = comm.size(), r = comm.rank();
  const int64_t chunk = 3, tokens = chunk * tp, k = 16, n = 10;
  std::vector<double> want(static_cast<size_t>(tokens * n), 0.0);
  for (int p = 0; p < tp; ++p) {
    const Operand ap(kind, normal_matrix(100 + p, tokens, k).data(), tokens, k, DType::kFloat8E4M3);
    const Operand bp(kind, normal_matrix(200 + p, n, k).data(), n, k, DType::kFloat8E4M3);
    const std::vector<double> part = reference_tn(ap.seen, bp.seen, tokens, k, n);
    for (size_t i = 0; i < want.size(); ++i) want[i] += part[i];
  }
  const Operand a(kind, normal_matrix(100 + r, tokens, k).data(), tokens, k, DType::kFloat8E4M3);
  const Operand b(kind, normal_matrix(200 + r, n, k).data(), n, k, DType::kFloat8E4M3);
  std::vector<float> unoverlapped;
  for (Overlap schedule : kSchedules) {
    Tensor d(DType::kFloat32, Shape{chunk, n});
    GemmArgs args;
    args.a = a.op();
    args.b = b.op();
    args.d = d;
    gemm_reduce_scatter(comm, args, schedule);
    expect_close(d.data_as<float>(), want.data() + r * chunk * n, size_t(chunk * n), 1e-5,
                 "reduced chunk");
    if (unoverlapped.empty())
      unoverlapped.assign(d.data_as<float>(), d.data_as<float>() + d.numel());
    else
      EXPECT_EQ(std::memcmp(unoverlapped.data(), d.data(), d.nbytes()), 0)
          << overlap_name(schedule) << " differs from none on rank " << r;
  }
}

}  // namespace qmesh::testing_overlap
