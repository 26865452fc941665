// Host FP8 encode throughput: fp32 -> e4m3 and bf16 -> e4m3 array conversion, in elements/s,
// next to memcpy of the same input bytes (the bandwidth bound for a streaming conversion).
// Single-threaded: numbers are per core.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <vector>

#include "qmesh/float16.h"
#include "qmesh/fp8.h"

namespace {

std::vector<float> random_floats(size_t n) {
  std::mt19937 rng(1);
  std::normal_distribution<float> dist(0.0f, 50.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = dist(rng);
  return x;
}

void BM_Fp32ToE4M3(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  const auto x = random_floats(n);
  std::vector<uint8_t> q(n);
  for (auto _ : state) {
    qmesh::fp32_to_fp8(x.data(), q.data(), n, qmesh::DType::kFloat8E4M3, 2.0f);
    benchmark::DoNotOptimize(q.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(n));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n * 5));
}

void BM_Bf16ToE4M3(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  const auto x = random_floats(n);
  std::vector<uint16_t> b(n);
  qmesh::fp32_to_bf16(x.data(), b.data(), n);
  std::vector<uint8_t> q(n);
  for (auto _ : state) {
    qmesh::bf16_to_fp8(b.data(), q.data(), n, qmesh::DType::kFloat8E4M3, 2.0f);
    benchmark::DoNotOptimize(q.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(n));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(n * 3));
}

// memcpy of the input bytes (elem_bytes per element): the reference for the ratio.
void BM_Memcpy(benchmark::State& state) {
  const size_t n = size_t(state.range(0)), elem_bytes = size_t(state.range(1));
  std::vector<char> a(n * elem_bytes, 1), b(n * elem_bytes);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), a.size());
    benchmark::DoNotOptimize(b.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(n));
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * a.size()));
}

void BM_E4M3ToFp32(benchmark::State& state) {
  const size_t n = size_t(state.range(0));
  const auto x = random_floats(n);
  std::vector<uint8_t> q(n);
  qmesh::fp32_to_fp8(x.data(), q.data(), n, qmesh::DType::kFloat8E4M3, 1.0f);
  std::vector<float> y(n);
  for (auto _ : state) {
    qmesh::fp8_to_fp32(q.data(), y.data(), n, qmesh::DType::kFloat8E4M3, 0.5f);
    benchmark::DoNotOptimize(y.data());
  }
  state.SetItemsProcessed(int64_t(state.iterations()) * int64_t(n));
}

// 64 Ki elements stays in L2; 16 Mi elements streams from memory.
BENCHMARK(BM_Fp32ToE4M3)->Arg(1 << 16)->Arg(1 << 24);
BENCHMARK(BM_Bf16ToE4M3)->Arg(1 << 16)->Arg(1 << 24);
BENCHMARK(BM_E4M3ToFp32)->Arg(1 << 16)->Arg(1 << 24);
BENCHMARK(BM_Memcpy)
    ->Args({1 << 16, 4})
    ->Args({1 << 24, 4})
    ->Args({1 << 16, 2})
    ->Args({1 << 24, 2});

}  // namespace

BENCHMARK_MAIN();
