// CPU backend throughput of quantize, cast_transpose and the 1x128 block cast (with and without
// the columnwise copy) against memcpy (Google Benchmark). Bytes counted: input read + FP8
// output(s) written (block scales not counted); memcpy counts its read + write.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/float16.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/quantize.h"

namespace {

using qmesh::DType;
using qmesh::Shape;

qmesh::Tensor random_input(DType dtype, int64_t n) {
  qmesh::Tensor x(dtype, Shape{n / 4096, 4096});
  std::mt19937 rng(1);
  std::normal_distribution<float> dist;
  for (int64_t i = 0; i < n; ++i) {
    const float v = dist(rng);
    if (dtype == DType::kFloat32)
      x.data_as<float>()[i] = v;
    else
      static_cast<uint16_t*>(x.data())[i] = qmesh::float_to_bf16(v);
  }
  return x;
}

void BM_Memcpy(benchmark::State& state) {
  const int64_t n = state.range(0) * state.range(0);
  const size_t bytes = n * sizeof(uint16_t);
  qmesh::Buffer src(bytes, qmesh::Device::host()), dst(bytes, qmesh::Device::host());
  std::memset(src.data(), 1, bytes);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * 2 * int64_t(bytes));
}

template <DType kIn, bool kTranspose>
void BM_Cast(benchmark::State& state) {
  const int64_t edge = state.range(0);
  const qmesh::Tensor x = random_input(kIn, edge * edge);
  const qmesh::TensorView xv(x.data(), kIn, Shape{edge, edge});
  qmesh::QuantizedTensor q(DType::kFloat8E4M3, Shape{edge, edge}, qmesh::Device::host(),
                           kTranspose);
  *q.view().scale = 64.0f;
  for (auto _ : state) {
    if (kTranspose)
      qmesh::cast_transpose(xv, q.view());
    else
      qmesh::quantize(xv, q.view());
    benchmark::ClobberMemory();
  }
  const int64_t bytes = edge * edge * int64_t(qmesh::dtype_size(kIn) + (kTranspose ? 2 : 1));
  state.SetBytesProcessed(int64_t(state.iterations()) * bytes);
}

// block_quantize with 1x128 blocks, as the layers cast activations and gradients: with the
// columnwise copy, or rowwise only (a sequence-parallel shard).
template <bool kColumnwise>
void BM_BlockCast(benchmark::State& state) {
  const int64_t edge = state.range(0);
  const qmesh::Tensor x = random_input(DType::kFloat32, edge * edge);
  const qmesh::TensorView xv(x.data(), DType::kFloat32, Shape{edge, edge});
  const qmesh::BlockQuantizedTensor q(DType::kFloat8E4M3, Shape{edge, edge},
                                      qmesh::BlockShape::k1x128, qmesh::Device::host(),
                                      kColumnwise);
  for (auto _ : state) {
    qmesh::block_quantize(xv, q.view(), qmesh::QParams{});
    benchmark::ClobberMemory();
  }
  const int64_t bytes = edge * edge * int64_t(sizeof(float) + (kColumnwise ? 2 : 1));
  state.SetBytesProcessed(int64_t(state.iterations()) * bytes);
}

BENCHMARK(BM_Memcpy)->Arg(4096)->Arg(8192)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Cast<DType::kBFloat16, false>)
    ->Name("BM_Quantize_bf16_e4m3")
    ->Arg(4096)
    ->Arg(8192)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Cast<DType::kFloat32, false>)
    ->Name("BM_Quantize_fp32_e4m3")
    ->Arg(4096)
    ->Arg(8192)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Cast<DType::kBFloat16, true>)
    ->Name("BM_CastTranspose_bf16_e4m3")
    ->Arg(4096)
    ->Arg(8192)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_Cast<DType::kFloat32, true>)
    ->Name("BM_CastTranspose_fp32_e4m3")
    ->Arg(4096)
    ->Arg(8192)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_BlockCast<true>)
    ->Name("BM_BlockCast_fp32_e4m3")
    ->Arg(2048)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_BlockCast<false>)
    ->Name("BM_BlockCastRowwise_fp32_e4m3")
    ->Arg(2048)
    ->Arg(4096)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
