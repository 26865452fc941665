// GPU GEMM throughput of qmesh's cuBLASLt backend: FP8 (e4m3 × e4m3 → bf16, fast
// accumulation, TN) and BF16 (bf16 × bf16 → bf16, TN) at 4096³, 8192³ and the transformer
// shapes M = 8192 tokens, (K, N) ∈ {(4096, 12288), (4096, 4096), (4096, 16384),
// (16384, 4096)}. Prints a table, then one JSON object. Exits 0 with "no GPU" on a machine
// without one. Each GEMM is timed twice in the same run: with the cuBLASLt heuristic's first
// algorithm and autotuned (the program sets QMESH_GEMM_AUTOTUNE itself).
//   usage: gemm_gpu_bench [--iters N] [--json FILE] (--help)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "qmesh/copy.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/owned_stream.h"
#include "qmesh/quantized_tensor.h"

namespace {

struct Shape3 {
  int64_t m, n, k;
};

// Random host bytes of `n` elements of `dtype` (values in [-1, 1], FP8 scaled by 448).
std::vector<uint8_t> random_bytes(qmesh::DType dtype, int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& v : x) v = dist(rng);
  std::vector<uint8_t> out(size_t(n) * qmesh::dtype_size(dtype));
  if (qmesh::is_fp8(dtype))
    qmesh::fp32_to_fp8(x.data(), out.data(), x.size(), dtype, 448.0f);
  else
    qmesh::fp32_to_bf16(x.data(), reinterpret_cast<uint16_t*>(out.data()), x.size());
  return out;
}

// Milliseconds per GEMM on `stream`, averaged over `iters` runs after 10 warm-up runs.
double time_gemm(const qmesh::GemmArgs& args, int iters, qmesh::Stream on) {
  const auto stream = static_cast<cudaStream_t>(on.handle);
  qmesh::Gemm op;
  op.initialize(args, nullptr, on);
  for (int i = 0; i < 10; ++i) op.run(on);
  cudaEvent_t start, stop;
  QMESH_CHECK_CUDA(cudaEventCreate(&start));
  QMESH_CHECK_CUDA(cudaEventCreate(&stop));
  QMESH_CHECK_CUDA(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) op.run(on);
  QMESH_CHECK_CUDA(cudaEventRecord(stop, stream));
  QMESH_CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  QMESH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return double(ms) / iters;
}

double tflops(const Shape3& s, double ms) {
  return 2.0 * double(s.m) * double(s.n) * double(s.k) / (ms * 1e-3) * 1e-12;
}

// One operand on cuda:0 with random values: FP8 (unit scales, from QuantizedTensor) or bf16.
struct Operand {
  qmesh::QuantizedTensor fp8;
  qmesh::Tensor plain;

  Operand(qmesh::DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
    const qmesh::Device dev = qmesh::Device::cuda(0);
    const auto host = random_bytes(dtype, rows * cols, seed);
    void* dst = nullptr;
    if (qmesh::is_fp8(dtype)) {
      fp8 = qmesh::QuantizedTensor(dtype, qmesh::Shape{rows, cols}, dev, false);
      dst = fp8.data().data();
    } else {
      plain = qmesh::Tensor(dtype, qmesh::Shape{rows, cols}, dev);
      dst = plain.data();
    }
    qmesh::copy_bytes(dst, dev, host.data(), qmesh::Device::host(), host.size());
  }
  qmesh::GemmOperand operand() const {
    return plain.data() ? qmesh::GemmOperand::plain(plain.view())
                        : qmesh::GemmOperand::fp8(fp8.view());
  }
};

// TFLOP/s of the TN GEMM A [M, K] · B [N, K]ᵀ → bf16 D with inputs of `dtype`, with the
// heuristic's algorithm ([0]) and autotuned ([1]). FP8 uses fast accumulation (forward).
std::array<double, 2> bench(const Shape3& s, qmesh::DType dtype, int iters, qmesh::Stream stream) {
  const Operand a(dtype, s.m, s.k, 1), b(dtype, s.n, s.k, 2);
  const qmesh::Tensor d(qmesh::DType::kBFloat16, qmesh::Shape{s.m, s.n}, qmesh::Device::cuda(0));
  qmesh::GemmArgs args;
  args.a = a.operand();
  args.b = b.operand();
  args.d = d.view();
  args.accumulation = qmesh::GemmAccumulation::kFast;
  std::array<double, 2> result{};
  for (int tuned = 0; tuned < 2; ++tuned) {
    setenv("QMESH_GEMM_AUTOTUNE", tuned ? "1" : "0", 1);  // read at each initialize()
    result[size_t(tuned)] = tflops(s, time_gemm(args, iters, stream));
  }
  return result;
}

}  // namespace

int main(int argc, char** argv) try {
  int iters = 50;
  std::string json_path;
  const auto usage = [](const char*) {
    std::printf(
        "usage: gemm_gpu_bench [--iters N] [--json FILE]\n"
        "  FP8 and BF16 GEMM throughput of the cuBLASLt backend on GPU 0\n"
        "  --iters: timed runs per GEMM (default 50; 10 warm-up runs precede them)\n"
        "  --json:  also write the JSON object to FILE\n");
  };
  qmesh::bench::iters_and_json_options(argc, argv, usage, iters, json_path);
  if (qmesh::cuda_device_count() == 0) {
    std::printf("no GPU: gemm_gpu_bench needs a CUDA device; nothing was measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const Shape3 shapes[] = {{4096, 4096, 4096}, {8192, 8192, 8192},  {8192, 12288, 4096},
                           {8192, 4096, 4096}, {8192, 16384, 4096}, {8192, 4096, 16384}};
  std::printf("device: %s, %d iterations; TFLOP/s with the heuristic's algorithm and autotuned\n",
              prop.name, iters);
  std::printf("%6s %6s %6s | %9s %9s | %9s %9s | %9s\n", "M", "N", "K", "fp8", "fp8 tuned", "bf16",
              "bf16 tuned", "fp8/bf16");
  std::string json = std::string("{\"device\": \"") + prop.name + "\", \"results\": [";
  // One stream for every GEMM: cuBLASLt workspaces are kept per stream.
  const qmesh::OwnedStream stream(qmesh::Device::cuda(0));
  bool first = true;
  for (const Shape3& s : shapes) {
    // [fp8, bf16] × [heuristic, autotuned]
    const std::array<double, 2> t[2] = {bench(s, qmesh::DType::kFloat8E4M3, iters, stream.get()),
                                        bench(s, qmesh::DType::kBFloat16, iters, stream.get())};
    const double best_fp8 = std::max(t[0][0], t[0][1]), best_bf16 = std::max(t[1][0], t[1][1]);
    std::printf("%6lld %6lld %6lld | %9.1f %9.1f | %9.1f %9.1f | %9.2f\n", (long long)s.m,
                (long long)s.n, (long long)s.k, t[0][0], t[0][1], t[1][0], t[1][1],
                best_fp8 / best_bf16);
    char entry[320];
    std::snprintf(entry, sizeof(entry),
                  "%s{\"m\": %lld, \"n\": %lld, \"k\": %lld, \"fp8_tflops\": %.1f, "
                  "\"fp8_tuned_tflops\": %.1f, \"bf16_tflops\": %.1f, \"bf16_tuned_tflops\": %.1f}",
                  first ? "" : ", ", (long long)s.m, (long long)s.n, (long long)s.k, t[0][0],
                  t[0][1], t[1][0], t[1][1]);
    json += entry;
    first = false;
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  return 0;
} catch (const qmesh::Error& e) {
  std::fprintf(stderr, "gemm_gpu_bench: %s\n", e.message().c_str());
  return 1;
}
