// dense_gpu_bench: forward + backward time of one LayerNormMLP block on GPU 0 (batch 4 x seq
// 2048 = 8192 tokens, hidden 4096, ffn 16384: about 6.6 TFLOP per step) in BF16, FP8 delayed
// and FP8 current scaling, and each FP8 recipe's speed-up over BF16 (targets on an H100:
// delayed >= 1.8x, current >= 1.65x). Plain argv parsing, no Boost, so that it builds wherever
// the CUDA toolkit does. Each step (forward, backward and the delayed-scaling end_step) is
// timed with CUDA events on the block's stream after 2 warm-up steps; the median, minimum and
// maximum are reported. The mesh is the local backend's one rank: no collective runs (a
// one-rank amax reduction issues none). Prints a table, then one JSON object. Exits 0 with
// "no GPU" on a machine without one.
//   usage: dense_gpu_bench [--iters N] [--tokens T] [--hidden H] [--ffn F] [--recipes LIST]
//                          [--json FILE]
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

// Milliseconds of each of `iters` training steps of `recipe`, sorted.
std::vector<float> step_ms(qmesh::Recipe recipe, int64_t tokens, int64_t hidden, int64_t ffn,
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
  return ms;
}

// "bf16,delayed" -> the recipes, in that order.
std::vector<qmesh::Recipe> parse_recipes(const std::string& list) {
  std::vector<qmesh::Recipe> out;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    out.push_back(qmesh::parse_recipe(list.substr(begin, end - begin)));
    begin = end + 1;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) try {
  int iters = 20;
  std::vector<qmesh::Recipe> recipes = {qmesh::Recipe::kBf16, qmesh::Recipe::kFp8Delayed,
                                        qmesh::Recipe::kFp8Current};
  int64_t tokens = 4 * 2048, hidden = 4096, ffn = 16384;
  std::string json_path;
  const auto usage = [](const char*) {
    std::printf(
        "usage: dense_gpu_bench [--iters N] [--tokens T] [--hidden H] [--ffn F] [--recipes LIST]\n"
        "                       [--json FILE]\n"
        "  one LayerNormMLP forward+backward on GPU 0: BF16, FP8 delayed, FP8 current scaling\n"
        "  --iters:  timed steps per recipe (default 20, at least 10 for the targets; after 2\n"
        "            warm-up steps; median, min and max reported)\n"
        "  --tokens: batch x seq (default 8192), --hidden (4096), --ffn (16384); FP8 needs\n"
        "            multiples of 16\n"
        "  --recipes: comma-separated subset of bf16,delayed,current (default all three; the\n"
        "            speed-ups need bf16 first)\n"
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
                                  else if (arg == "--recipes")
                                    recipes = parse_recipes(value);
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
  std::printf("%-12s %10s %10s %10s %10s %9s\n", "recipe", "median ms", "min ms", "max ms",
              "TFLOP/s", "vs bf16");
  std::string json =
      std::string("{\"device\": \"") + prop.name + "\", \"tokens\": " + std::to_string(tokens) +
      ", \"hidden\": " + std::to_string(hidden) + ", \"ffn\": " + std::to_string(ffn) +
      ", \"steps\": " + std::to_string(iters) + ", \"results\": [";
  double bf16_ms = 0;
  for (qmesh::Recipe recipe : recipes) {
    const std::vector<float> ms = step_ms(recipe, tokens, hidden, ffn, iters);
    const double median = ms[ms.size() / 2];
    if (recipe == qmesh::Recipe::kBf16) bf16_ms = median;
    const double tflops = flops / (median * 1e-3) / 1e12;
    const double speedup = bf16_ms > 0 ? bf16_ms / median : 0.0;
    const std::string name(qmesh::recipe_name(recipe));
    std::printf("%-12s %10.3f %10.3f %10.3f %10.1f %8.2fx\n", name.c_str(), median, ms.front(),
                ms.back(), tflops, speedup);
    char entry[256];
    std::snprintf(entry, sizeof(entry),
                  "%s{\"recipe\": \"%s\", \"median_ms\": %.4f, \"min_ms\": %.4f, \"max_ms\": %.4f, "
                  "\"tflops\": %.2f, \"speedup_vs_bf16\": %.3f}",
                  recipe == recipes[0] ? "" : ", ", name.c_str(), median, double(ms.front()),
                  double(ms.back()), tflops, speedup);
    json += entry;
  }
  std::printf("\ntargets on an H100: delayed >= 1.8x, current >= 1.65x today's BF16\n");
  json += "]}";
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  return 0;
} catch (const qmesh::Error& e) {
  std::fprintf(stderr, "dense_gpu_bench: %s\n", e.message().c_str());
  return 1;
}
