// Host GEMM throughput: qmesh's FP8 GEMM (e4m3 × e4m3, fp32 and bf16 D) against a plain
// OpenBLAS sgemm of the same shape and layout (TN: A [M, K], B [N, K]). The FP8 GEMM pays
// for widening its operands to fp32 and for the epilogue pass on top of the same sgemm, so
// the ratio measures that overhead. Square shapes 1024, 2048, 4096; threads from
// OPENBLAS_NUM_THREADS.
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cstdint>
#include <random>
#include <vector>

#include "qmesh/fp8.h"
#include "qmesh/ops/gemm.h"

namespace {

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

void set_flops(benchmark::State& state, int64_t n) {
  state.counters["GFLOP/s"] = benchmark::Counter(
      2.0 * double(n) * double(n) * double(n) * 1e-9 * double(state.iterations()),
      benchmark::Counter::kIsRate);
}

void BM_OpenBlasSgemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> a = random_floats(size_t(n * n), 1), b = random_floats(size_t(n * n), 2);
  std::vector<float> d(size_t(n * n));
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(n), int(n), int(n), 1.0f, a.data(),
                int(n), b.data(), int(n), 0.0f, d.data(), int(n));
    benchmark::DoNotOptimize(d.data());
  }
  set_flops(state, n);
}

// One FP8 operand with its scalars (scale = 448 / amax), quantized by the host encoder.
struct Fp8Matrix {
  std::vector<uint8_t> codes;
  float scalars[3] = {448.0f, 1.0f / 448.0f, 1.0f};
  Fp8Matrix(int64_t rows, int64_t cols, uint32_t seed) : codes(size_t(rows * cols)) {
    const std::vector<float> x = random_floats(codes.size(), seed);
    qmesh::fp32_to_fp8(x.data(), codes.data(), x.size(), qmesh::DType::kFloat8E4M3, scalars[0]);
    shape = qmesh::Shape{rows, cols};
  }
  qmesh::GemmOperand operand() {
    qmesh::QuantizedTensorView q;
    q.data = qmesh::TensorView(codes.data(), qmesh::DType::kFloat8E4M3, shape);
    q.scale = &scalars[0];
    q.scale_inv = &scalars[1];
    q.amax = &scalars[2];
    return qmesh::GemmOperand::fp8(q);
  }
  qmesh::Shape shape;
};

void fp8_gemm(benchmark::State& state, qmesh::DType d_dtype) {
  const int64_t n = state.range(0);
  Fp8Matrix a(n, n, 1), b(n, n, 2);
  std::vector<uint8_t> d(size_t(n * n) * qmesh::dtype_size(d_dtype));
  qmesh::GemmArgs args;
  args.a = a.operand();
  args.b = b.operand();
  args.d = qmesh::TensorView(d.data(), d_dtype, qmesh::Shape{n, n});
  qmesh::Gemm op;
  op.initialize(args, nullptr, {});
  for (auto _ : state) {
    op.run({});
    benchmark::DoNotOptimize(d.data());
  }
  set_flops(state, n);
}

void BM_QmeshFp8Gemm_Fp32Out(benchmark::State& state) { fp8_gemm(state, qmesh::DType::kFloat32); }
void BM_QmeshFp8Gemm_Bf16Out(benchmark::State& state) { fp8_gemm(state, qmesh::DType::kBFloat16); }

}  // namespace

BENCHMARK(BM_OpenBlasSgemm)
    ->Arg(1024)
    ->Arg(2048)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_QmeshFp8Gemm_Fp32Out)
    ->Arg(1024)
    ->Arg(2048)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_QmeshFp8Gemm_Bf16Out)
    ->Arg(1024)
    ->Arg(2048)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
