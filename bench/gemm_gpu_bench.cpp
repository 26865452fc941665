// GPU GEMM throughput of qmesh's cuBLASLt backend: FP8 (e4m3 × e4m3 → bf16, fast
// accumulation, TN) and BF16 (bf16 × bf16 → bf16, TN) at 4096³, 8192³ and the transformer
// shapes M = 8192 tokens, (K, N) ∈ {(4096, 12288), (4096, 4096), (4096, 16384),
// (16384, 4096)}. Prints a table, then one JSON object. Exits 0 with "no GPU" on a machine
// without one. Each GEMM is timed twice in the same run: with the cuBLASLt heuristic's first
// algorithm and autotuned (the program sets QMESH_GEMM_AUTOTUNE itself).
//   usage: gemm_gpu_bench [--iters N] [--json FILE]
//   --iters: timed runs per GEMM (default 50; 10 warm-up runs precede them)
//   --json:  also write the JSON object to FILE
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/device.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/quantized_tensor.h"

namespace {

struct Shape3 {
  int64_t m, n, k;
};

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s failed: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

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

// Milliseconds per GEMM, averaged over `iters` runs after 10 warm-up runs.
double time_gemm(const qmesh::GemmArgs& args, int iters) {
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  qmesh::Gemm op;
  op.initialize(args, nullptr, {stream});
  for (int i = 0; i < 10; ++i) op.run({stream});
  cudaEvent_t start, stop;
  check(cudaEventCreate(&start), "cudaEventCreate");
  check(cudaEventCreate(&stop), "cudaEventCreate");
  check(cudaEventRecord(start, stream), "cudaEventRecord");
  for (int i = 0; i < iters; ++i) op.run({stream});
  check(cudaEventRecord(stop, stream), "cudaEventRecord");
  check(cudaEventSynchronize(stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return double(ms) / iters;
}

double tflops(const Shape3& s, double ms) {
  return 2.0 * double(s.m) * double(s.n) * double(s.k) / (ms * 1e-3) * 1e-12;
}

double bench_fp8(const Shape3& s, int iters) {
  const qmesh::Device dev = qmesh::Device::cuda(0);
  const qmesh::DType e4 = qmesh::DType::kFloat8E4M3;
  qmesh::QuantizedTensor a(e4, qmesh::Shape{s.m, s.k}, dev, false);
  qmesh::QuantizedTensor b(e4, qmesh::Shape{s.n, s.k}, dev, false);
  qmesh::Tensor d(qmesh::DType::kBFloat16, qmesh::Shape{s.m, s.n}, dev);
  const auto ha = random_bytes(e4, s.m * s.k, 1), hb = random_bytes(e4, s.n * s.k, 2);
  qmesh::copy_bytes(a.data().data(), dev, ha.data(), qmesh::Device::host(), ha.size());
  qmesh::copy_bytes(b.data().data(), dev, hb.data(), qmesh::Device::host(), hb.size());
  qmesh::GemmArgs args;
  args.a = qmesh::GemmOperand::fp8(a.view());
  args.b = qmesh::GemmOperand::fp8(b.view());
  args.d = d.view();
  args.accumulation = qmesh::GemmAccumulation::kFast;
  return time_gemm(args, iters);
}

double bench_bf16(const Shape3& s, int iters) {
  const qmesh::Device dev = qmesh::Device::cuda(0);
  const qmesh::DType bf = qmesh::DType::kBFloat16;
  qmesh::Tensor a(bf, qmesh::Shape{s.m, s.k}, dev), b(bf, qmesh::Shape{s.n, s.k}, dev);
  qmesh::Tensor d(bf, qmesh::Shape{s.m, s.n}, dev);
  const auto ha = random_bytes(bf, s.m * s.k, 1), hb = random_bytes(bf, s.n * s.k, 2);
  qmesh::copy_bytes(a.data(), dev, ha.data(), qmesh::Device::host(), ha.size());
  qmesh::copy_bytes(b.data(), dev, hb.data(), qmesh::Device::host(), hb.size());
  qmesh::GemmArgs args;
  args.a = qmesh::GemmOperand::plain(a.view());
  args.b = qmesh::GemmOperand::plain(b.view());
  args.d = d.view();
  return time_gemm(args, iters);
}

}  // namespace

int main(int argc, char** argv) {
  int iters = 50;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
      iters = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      json_path = argv[++i];
    } else {
      std::fprintf(stderr, "usage: gemm_gpu_bench [--iters N] [--json FILE]\n");
      return 2;
    }
  }
  if (iters <= 0) {
    std::fprintf(stderr, "gemm_gpu_bench: --iters must be > 0\n");
    return 2;
  }
  if (qmesh::cuda_device_count() == 0) {
    std::printf("no GPU: gemm_gpu_bench needs a CUDA device; nothing was measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  const Shape3 shapes[] = {{4096, 4096, 4096}, {8192, 8192, 8192},  {8192, 12288, 4096},
                           {8192, 4096, 4096}, {8192, 16384, 4096}, {8192, 4096, 16384}};
  std::printf("device: %s, %d iterations; TFLOP/s with the heuristic's algorithm and autotuned\n",
              prop.name, iters);
  std::printf("%6s %6s %6s | %9s %9s | %9s %9s | %9s\n", "M", "N", "K", "fp8", "fp8 tuned", "bf16",
              "bf16 tuned", "fp8/bf16");
  std::string json = std::string("{\"device\": \"") + prop.name + "\", \"results\": [";
  bool first = true;
  for (const Shape3& s : shapes) {
    // [fp8, bf16] × [heuristic, autotuned]; the tunable is read at each initialize().
    double t[2][2];
    for (int tuned = 0; tuned < 2; ++tuned) {
      setenv("QMESH_GEMM_AUTOTUNE", tuned ? "1" : "0", 1);
      t[0][tuned] = tflops(s, bench_fp8(s, iters));
      t[1][tuned] = tflops(s, bench_bf16(s, iters));
    }
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
}
