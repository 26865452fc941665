// dense_gpu_bench: forward + backward time of one LayerNormMLP block on GPU 0 (batch 4 x seq
// 2048 = 8192 tokens, hidden 4096, ffn 16384: about 6.6 TFLOP per step) in BF16 and FP8 delayed
// scaling, and the FP8 speed-up (the target on H100/H200 is >= 1.8x). Plain argv parsing, no
// Boost, so that it builds wherever the CUDA toolkit does. Each step (forward, backward and the
// delayed-scaling end_step) is timed with CUDA events on the block's stream after 2 warm-up
// steps; the median is reported. The mesh is the local backend's one rank (no collective runs
// at tp = 1, except delayed scaling's amax reduction of a few floats, staged through the host).
// Prints a table, then one JSON object. Exits 0 with "no GPU" on a machine without one.
//   usage: dense_gpu_bench [--iters N] [--tokens T] [--hidden H] [--ffn F] [--json FILE]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "mlp_step.h"
#include "qmesh/comm/local.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/error.h"
#include "qmesh/owned_stream.h"

namespace {

// Median milliseconds of one training step of `recipe`.
double median_step_ms(qmesh::Recipe recipe, int64_t tokens, int64_t hidden, int64_t ffn,
                      int iters) {
  std::vector<float> ms(size_t(iters), 0.0f);
  qmesh::run_local_ranks(1, [&](qmesh::Communicator& comm) {
    const qmesh::OwnedStream owned(qmesh::Device::cuda(0));
    const auto stream = static_cast<cudaStream_t>(owned.get().handle);
    {
      const std::shared_ptr<qmesh::Communicator> world(&comm, [](qmesh::Communicator*) {});
      bench::MlpStep step(world, recipe, tokens, hidden, ffn,
                          qmesh::Placement{qmesh::Device::cuda(0), owned.get(), {}});
      for (int i = 0; i < 2; ++i) step.run();  // plans, workspaces, scaling state
      std::vector<cudaEvent_t> events(size_t(iters) + 1);
      for (auto& e : events) QMESH_CHECK_CUDA(cudaEventCreate(&e));
      QMESH_CHECK_CUDA(cudaEventRecord(events[0], stream));
      for (int i = 0; i < iters; ++i) {
        step.run();
        QMESH_CHECK_CUDA(cudaEventRecord(events[size_t(i) + 1], stream));
      }
      QMESH_CHECK_CUDA(cudaEventSynchronize(events.back()));
      for (int i = 0; i < iters; ++i)
        QMESH_CHECK_CUDA(
            cudaEventElapsedTime(&ms[size_t(i)], events[size_t(i)], events[size_t(i) + 1]));
      for (auto& e : events) cudaEventDestroy(e);
    }
  });
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) try {
  int iters = 10;
  int64_t tokens = 4 * 2048, hidden = 4096, ffn = 16384;
  std::string json_path;
  const auto usage = [](const char*) {
    std::printf(
        "usage: dense_gpu_bench [--iters N] [--tokens T] [--hidden H] [--ffn F] [--json FILE]\n"
        "  one LayerNormMLP forward+backward on GPU 0, BF16 vs FP8 delayed scaling\n"
        "  --iters:  timed steps per recipe (default 10, after 2 warm-up steps; median "
        "reported)\n"
        "  --tokens: batch x seq (default 8192), --hidden (4096), --ffn (16384); FP8 needs\n"
        "            multiples of 16\n"
        "  --json:   also write the JSON object to FILE\n");
  };
  qmesh::bench::for_each_option(argc, argv, usage,
                                [&](const std::string& arg, const std::string& value) {
                                  if (arg == "--iters")
                                    iters = qmesh::bench::positive(arg, value);
                                  else if (arg == "--tokens")
                                    tokens = qmesh::bench::int_option(arg, value, 1);
                                  else if (arg == "--hidden")
                                    hidden = qmesh::bench::int_option(arg, value, 1);
                                  else if (arg == "--ffn")
                                    ffn = qmesh::bench::int_option(arg, value, 1);
                                  else if (arg == "--json")
                                    json_path = value;
                                  else
                                    QMESH_THROW("unknown option ", arg, " (see --help)");
                                });
  if (qmesh::cuda_device_count() == 0) {
    std::printf("no GPU: dense_gpu_bench needs a CUDA device; nothing was measured\n");
    return 0;
  }
  cudaDeviceProp prop{};
  QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const double flops = bench::MlpStep::flops(tokens, hidden, ffn);
  std::printf("%s: LayerNormMLP forward+backward, %lld tokens, hidden %lld, ffn %lld\n\n",
              prop.name, (long long)tokens, (long long)hidden, (long long)ffn);
  std::printf("%-10s %12s %10s\n", "recipe", "time [ms]", "TFLOP/s");
  std::string json = std::string("{\"device\": \"") + prop.name +
                     "\", \"tokens\": " + std::to_string(tokens) +
                     ", \"hidden\": " + std::to_string(hidden) +
                     ", \"ffn\": " + std::to_string(ffn) + ", \"results\": [";
  double ms[2] = {0, 0};
  const qmesh::Recipe recipes[2] = {qmesh::Recipe::kBf16, qmesh::Recipe::kFp8Delayed};
  for (int r = 0; r < 2; ++r) {
    ms[r] = median_step_ms(recipes[r], tokens, hidden, ffn, iters);
    const double tflops = flops / (ms[r] * 1e-3) / 1e12;
    const std::string name(qmesh::recipe_name(recipes[r]));
    std::printf("%-10s %12.3f %10.1f\n", name.c_str(), ms[r], tflops);
    char entry[160];
    std::snprintf(entry, sizeof(entry), "%s{\"recipe\": \"%s\", \"ms\": %.4f, \"tflops\": %.2f}",
                  r ? ", " : "", name.c_str(), ms[r], tflops);
    json += entry;
  }
  const double speedup = ms[0] / ms[1];
  std::printf("\nFP8 speed-up over BF16: %.2fx (target >= 1.8x)\n", speedup);
  char tail[64];
  std::snprintf(tail, sizeof(tail), "], \"fp8_speedup\": %.3f}", speedup);
  json += tail;
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  return 0;
} catch (const qmesh::Error& e) {
  std::fprintf(stderr, "dense_gpu_bench: %s\n", e.message().c_str());
  return 1;
}
