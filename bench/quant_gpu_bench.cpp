// GPU throughput of the fused cast_transpose + amax (bf16 -> e4m3) against the measured
// device-to-device copy bandwidth (bytes read + written in both cases), and the latency of
// the fused delayed-scaling update of 1000 tensors x history 1024. Prints a table, then one
// JSON object (also to --json FILE). Without a GPU it says "no GPU" and exits 0.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "qmesh/copy.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/scaling/scaling_states.h"

namespace {

using qmesh::Device;
using qmesh::DType;
using qmesh::Shape;

constexpr int kWarmup = 5;
constexpr int kIters = 50;

// Mean milliseconds of fn() over kIters launches on the default stream (after kWarmup).
template <class Fn>
double time_ms(Fn&& fn) {
  for (int i = 0; i < kWarmup; ++i) fn();
  cudaEvent_t start, stop;
  QMESH_CHECK_CUDA(cudaEventCreate(&start));
  QMESH_CHECK_CUDA(cudaEventCreate(&stop));
  QMESH_CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < kIters; ++i) fn();
  QMESH_CHECK_CUDA(cudaEventRecord(stop));
  QMESH_CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  QMESH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  QMESH_CHECK_CUDA(cudaEventDestroy(start));
  QMESH_CHECK_CUDA(cudaEventDestroy(stop));
  return ms / kIters;
}

struct Row {
  int64_t rows, cols;
  double us, gbps, fraction;
};

}  // namespace

int main(int argc, char** argv) try {
  std::string json_path;
  const auto usage = [](const char*) {
    std::printf(
        "usage: quant_gpu_bench [--json FILE]\n"
        "  cast_transpose bf16->e4m3 throughput against the D2D copy bandwidth, and the fused\n"
        "  delayed-scaling update of 1000 tensors x history 1024, on GPU 0\n"
        "  --json: also write the JSON object to FILE\n");
  };
  qmesh::bench::for_each_option(
      argc, argv, usage, [&](const std::string& arg, const std::string& value) {
        QMESH_CHECK(arg == "--json", "unknown option ", arg, " (see --help)");
        json_path = value;
      });
  if (qmesh::cuda_device_count() == 0) {
    std::printf("no GPU: quant_gpu_bench needs a CUDA device\n");
    return 0;
  }
  const Device gpu = Device::cuda(0);
  cudaDeviceProp prop{};
  QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

  // Device-to-device copy of 1 GiB: the bandwidth reference (read + write).
  const size_t copy_bytes = size_t{1} << 30;
  qmesh::Buffer src(copy_bytes, gpu), dst(copy_bytes, gpu);
  QMESH_CHECK_CUDA(cudaMemset(src.data(), 1, copy_bytes));
  const double copy_ms = time_ms([&] {
    QMESH_CHECK_CUDA(cudaMemcpyAsync(dst.data(), src.data(), copy_bytes, cudaMemcpyDeviceToDevice));
  });
  const double copy_gbps = 2.0 * double(copy_bytes) / (copy_ms * 1e6);

  std::vector<Row> rows;
  for (auto [r, c] : {std::pair<int64_t, int64_t>{8192, 8192}, {8192, 4096}, {8192, 16384}}) {
    qmesh::Tensor x(DType::kBFloat16, Shape{r, c}, gpu);
    QMESH_CHECK_CUDA(cudaMemset(x.data(), 0x3F, x.nbytes()));  // bf16 0x3F3F ~ 0.75
    qmesh::QuantizedTensor q(DType::kFloat8E4M3, Shape{r, c}, gpu, true);
    const double ms = time_ms([&] { qmesh::cast_transpose(x, q.view()); });
    const double bytes = double(r) * double(c) * (2 + 1 + 1);
    const double gbps = bytes / (ms * 1e6);
    rows.push_back({r, c, ms * 1e3, gbps, gbps / copy_gbps});
  }

  qmesh::DelayedScaling recipe;  // history 1024
  qmesh::ScalingStates states(
      recipe, std::vector<qmesh::OperandRole>(1000, qmesh::OperandRole::kInput), gpu);
  std::vector<float> amax(1000, 3.0f);
  qmesh::Buffer amax_src(amax.size() * sizeof(float), gpu);
  qmesh::copy_bytes(amax_src.data(), gpu, amax.data(), Device::host(), amax_src.size());
  // Each timed update rolls every history: refill the current amaxes first (a 4 KB copy).
  const auto refill = [&] {
    QMESH_CHECK_CUDA(cudaMemcpyAsync(states.current_amax().data, amax_src.data(), amax_src.size(),
                                     cudaMemcpyDeviceToDevice));
  };
  const double refill_us = time_ms(refill) * 1e3;
  const double update_us = time_ms([&] {
                             refill();
                             states.update();
                           }) * 1e3 -
                           refill_us;

  std::printf("device: %s\n", prop.name);
  std::printf("cudaMemcpy D2D (read+write): %.0f GB/s\n\n", copy_gbps);
  std::printf("%-22s %10s %10s %10s\n", "cast_transpose bf16->e4m3", "time us", "GB/s", "of copy");
  for (const Row& row : rows)
    std::printf("%6lld x %-14lld %10.1f %10.0f %9.1f%%\n", (long long)row.rows, (long long)row.cols,
                row.us, row.gbps, 100.0 * row.fraction);
  std::printf("\nfused update, 1000 tensors x history 1024: %.1f us\n\n", update_us);

  char buf[256];
  std::snprintf(buf, sizeof(buf), "\", \"copy_gbps\": %.1f, \"cast_transpose\": [", copy_gbps);
  std::string json = std::string("{\"device\": \"") + prop.name + buf;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::snprintf(
        buf, sizeof(buf),
        "%s{\"rows\": %lld, \"cols\": %lld, \"us\": %.2f, \"gbps\": %.1f, \"fraction\": %.4f}",
        i ? ", " : "", (long long)rows[i].rows, (long long)rows[i].cols, rows[i].us, rows[i].gbps,
        rows[i].fraction);
    json += buf;
  }
  std::snprintf(buf, sizeof(buf), "], \"update_1000x1024_us\": %.2f}", update_us);
  json += buf;
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  return 0;
} catch (const qmesh::Error& e) {
  std::fprintf(stderr, "quant_gpu_bench: %s\n", e.message().c_str());
  return 1;
}
