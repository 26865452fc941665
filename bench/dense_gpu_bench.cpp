// dense_gpu_bench: forward + backward time of one LayerNormMLP block on GPU 0 (batch 4 x seq
// 2048 = 8192 tokens, hidden 4096, ffn 16384: about 6.6 TFLOP per step) in BF16 with fp32
// activations (the baseline before bf16 activations), BF16 with bf16 activations (the fair
// baseline: the same activation treatment as FP8), FP8 delayed, current and block scaling, and
// each configuration's speed-up over both BF16 ones (targets on an H100: delayed >= 1.8x the
// first and >= 1.6x the second, current >= 1.65x the first). Plain argv parsing, no Boost, so that
// it builds wherever the CUDA toolkit does. Each step (forward, backward and the delayed-scaling
// end_step) is timed with CUDA events on the block's stream after 2 warm-up steps; the median,
// minimum and maximum are reported. The mesh is the local backend's one rank: no collective runs (a
// one-rank amax reduction issues none). Prints a table, then one JSON object. Exits 0 with
// "no GPU" on a machine without one.
//   usage: dense_gpu_bench [--iters N] [--tokens T] [--hidden H] [--ffn F] [--recipes LIST]
//                          [--json FILE]
// LIST: RECIPE[:ACTIVATIONS],... with ACTIVATIONS fp32 or bf16 (default: the recipe's,
// LayerContextOptions::activation_dtype).
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

// A recipe and the dtype of the block's activations.
struct Config {
  qmesh::Recipe recipe;
  qmesh::DType activations;
  // "bf16:fp32" (recipe:activations).
  std::string name() const {
    return std::string(qmesh::recipe_name(recipe)) + ":" +
           std::string(qmesh::dtype_name(activations));
  }
};

// Milliseconds of each of `iters` training steps of `config`, sorted.
std::vector<float> step_ms(const Config& config, int64_t tokens, int64_t hidden, int64_t ffn,
                           int iters) {
  std::vector<float> ms(size_t(iters), 0.0f);
  qmesh::run_local_ranks(1, [&](qmesh::Communicator& comm) {
    const qmesh::OwnedStream owned(qmesh::Device::cuda(0));
    const auto stream = static_cast<cudaStream_t>(owned.get().handle);
    {
      const std::shared_ptr<qmesh::Communicator> world(&comm, [](qmesh::Communicator*) {});
      bench::MlpStep step(world, config.recipe, tokens, hidden, ffn,
                          qmesh::Placement{qmesh::Device::cuda(0), owned.get(), {}},
                          config.activations);
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

// "bf16:fp32,delayed" -> the configurations, in that order (activations after a colon, else
// the recipe's default).
std::vector<Config> parse_configs(const std::string& list) {
  std::vector<Config> out;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    const std::string item = list.substr(begin, end - begin);
    const size_t colon = item.find(':');
    const qmesh::Recipe recipe = qmesh::parse_recipe(item.substr(0, colon));
    qmesh::DType activations =
        recipe == qmesh::Recipe::kFp32 ? qmesh::DType::kFloat32 : qmesh::DType::kBFloat16;
    if (colon != std::string::npos) {
      activations = qmesh::parse_dtype(item.substr(colon + 1));
      QMESH_CHECK(activations == qmesh::DType::kFloat32 || activations == qmesh::DType::kBFloat16,
                  "--recipes ", item, ": the activations are fp32 or bf16");
    }
    out.push_back({recipe, activations});
    begin = end + 1;
  }
  return out;
}

// The median of the first configuration named `name` in `results` (0 if none ran).
double median_of(const std::vector<std::pair<std::string, double>>& results,
                 const std::string& name) {
  for (const auto& [n, ms] : results)
    if (n == name) return ms;
  return 0;
}

}  // namespace

int main(int argc, char** argv) try {
  int iters = 20;
  std::vector<Config> configs = parse_configs("bf16:fp32,bf16,delayed,current,block");
  int64_t tokens = 4 * 2048, hidden = 4096, ffn = 16384;
  std::string json_path;
  const auto usage = [](const char*) {
    std::printf(
        "usage: dense_gpu_bench [--iters N] [--tokens T] [--hidden H] [--ffn F] [--recipes LIST]\n"
        "                       [--json FILE]\n"
        "  one LayerNormMLP forward+backward on GPU 0: BF16 with fp32 and with bf16\n"
        "  activations, FP8 delayed, FP8 current and FP8 block scaling\n"
        "  --iters:  timed steps per recipe (default 20, at least 10 for the targets; after 2\n"
        "            warm-up steps; median, min and max reported)\n"
        "  --tokens: batch x seq (default 8192), --hidden (4096), --ffn (16384); FP8 needs\n"
        "            multiples of 16\n"
        "  --recipes: comma-separated RECIPE[:ACTIVATIONS] (recipe fp32, bf16, delayed,\n"
        "            current or block; activations fp32 or bf16, default the recipe's); default\n"
        "            bf16:fp32,bf16,delayed,current,block (the speed-ups need the BF16 ones\n"
        "            first)\n"
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
                                    configs = parse_configs(value);
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
  std::printf("%-14s %10s %10s %10s %10s %9s %9s\n", "recipe:act", "median ms", "min ms", "max ms",
              "TFLOP/s", "vs bf16", "vs fused");
  std::string json =
      std::string("{\"device\": \"") + prop.name + "\", \"tokens\": " + std::to_string(tokens) +
      ", \"hidden\": " + std::to_string(hidden) + ", \"ffn\": " + std::to_string(ffn) +
      ", \"steps\": " + std::to_string(iters) + ", \"results\": [";
  // Speed-ups over BF16 with fp32 activations (before) and with bf16 ones (the fair baseline).
  std::vector<std::pair<std::string, double>> medians;
  for (const Config& config : configs) {
    const std::vector<float> ms = step_ms(config, tokens, hidden, ffn, iters);
    const double median = ms[ms.size() / 2];
    const std::string name = config.name();
    medians.emplace_back(name, median);
    const double bf16_ms = median_of(medians, "bf16:fp32");
    const double fused_ms = median_of(medians, "bf16:bf16");
    const double tflops = flops / (median * 1e-3) / 1e12;
    const double speedup = bf16_ms > 0 ? bf16_ms / median : 0.0;
    const double speedup_fused = fused_ms > 0 ? fused_ms / median : 0.0;
    std::printf("%-14s %10.3f %10.3f %10.3f %10.1f %8.2fx %8.2fx\n", name.c_str(), median,
                ms.front(), ms.back(), tflops, speedup, speedup_fused);
    char entry[384];
    std::snprintf(entry, sizeof(entry),
                  "%s{\"recipe\": \"%s\", \"activations\": \"%s\", \"median_ms\": %.4f, "
                  "\"min_ms\": %.4f, \"max_ms\": %.4f, \"tflops\": %.2f, "
                  "\"speedup_vs_bf16\": %.3f, \"speedup_vs_fused_bf16\": %.3f}",
                  medians.size() == 1 ? "" : ", ",
                  std::string(qmesh::recipe_name(config.recipe)).c_str(),
                  std::string(qmesh::dtype_name(config.activations)).c_str(), median,
                  double(ms.front()), double(ms.back()), tflops, speedup, speedup_fused);
    json += entry;
  }
  std::printf(
      "\ntargets on an H100: delayed >= 1.8x BF16 (fp32 activations) and >= 1.6x fused BF16\n"
      "(bf16 activations), current >= 1.65x BF16 (fp32 activations)\n");
  json += "]}";
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  return 0;
} catch (const qmesh::Error& e) {
  std::fprintf(stderr, "dense_gpu_bench: %s\n", e.message().c_str());
  return 1;
}
