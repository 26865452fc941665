// dense_bench: forward + backward time of one LayerNormMLP block in BF16 and FP8 (delayed
// scaling), one rank, on the host backend or a GPU (--device). Prints a table and, with
// --json FILE, the same numbers as JSON. (dense_gpu_bench measures the same on a GPU without
// Boost.)
//
// The target shape is batch 4 x seq 2048 tokens, hidden 4096, ffn 16384 (about 6.6 TFLOP
// per step): far too much for a small CPU, so --scale S divides tokens, hidden and ffn by S
// (default 8 on the host, 1 on a GPU).
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

#include "cli_options.h"
#include "mlp_step.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/error.h"
#include "qmesh/version.h"

namespace po = boost::program_options;

namespace {

struct Result {
  std::string recipe;
  double seconds;  // median forward + backward time
  double tflops;
};

// Median wall time of a step, waiting for the device after each one (legacy default stream).
Result measure(qmesh::Recipe recipe, int64_t tokens, int64_t hidden, int64_t ffn, int iters,
               qmesh::Device device) {
  Result r{std::string(qmesh::recipe_name(recipe)), 0, 0};
  qmesh::run_local_ranks(1, [&](qmesh::Communicator& comm) {
    const std::shared_ptr<qmesh::Communicator> world(&comm, [](qmesh::Communicator*) {});
    bench::MlpStep step(world, recipe, tokens, hidden, ffn, qmesh::Placement{device, {}, {}});
    std::vector<double> times;
    for (int i = 0; i < iters + 1; ++i) {  // the first iteration warms up (allocations)
      const auto t0 = std::chrono::steady_clock::now();
      step.run();
      qmesh::synchronize(device);
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) times.push_back(s);
    }
    std::sort(times.begin(), times.end());
    r.seconds = times[times.size() / 2];
  });
  r.tflops = bench::MlpStep::flops(tokens, hidden, ffn) / r.seconds / 1e12;
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t batch = 4, seq = 2048, hidden = 4096, ffn = 16384, scale = 0;
  int iters = 3;
  std::string json, device_name = "cpu";
  po::options_description desc(
      "dense_bench: forward + backward of one LayerNormMLP block, BF16 vs FP8 delayed scaling\n"
      "Options");
  desc.add_options()("help,h", "show this help")("batch", po::value(&batch)->default_value(batch),
                                                 "sequences")(
      "seq", po::value(&seq)->default_value(seq), "tokens per sequence")(
      "hidden", po::value(&hidden)->default_value(hidden), "hidden size")(
      "ffn", po::value(&ffn)->default_value(ffn), "MLP inner size")(
      "scale", po::value(&scale)->default_value(scale),
      "divide tokens, hidden and ffn by this (1: the full shape; 0: 8 on cpu, 1 on cuda)")(
      "device", po::value(&device_name)->default_value(device_name), "cpu, or cuda (GPU 0)")(
      "iters", po::value(&iters)->default_value(iters), "timed iterations (median reported)")(
      "json", po::value(&json), "also write the results as JSON to this file");
  if (!bench::parse_options(argc, argv, desc)) return 0;
  QMESH_CHECK(device_name == "cpu" || device_name == "cuda", "--device must be cpu or cuda, got '",
              device_name, "'");
  const qmesh::Device device =
      device_name == "cuda" ? qmesh::Device::cuda(0) : qmesh::Device::host();
  qmesh::require_device(device);
  if (scale == 0) scale = device.is_host() ? 8 : 1;
  QMESH_CHECK(scale >= 1 && iters >= 1, "--scale and --iters must be >= 1");
  const int64_t tokens = batch * seq / scale, h = hidden / scale, f = ffn / scale;
  QMESH_CHECK(tokens >= 1 && h >= 1 && f >= 1, "--scale ", scale, " leaves an empty shape");
  std::printf(
      "%s\nLayerNormMLP forward+backward on %s, %lld tokens, hidden %lld, ffn %lld (scale "
      "1/%lld)\n\n",
      qmesh::build_info().c_str(), device.str().c_str(), (long long)tokens, (long long)h,
      (long long)f, (long long)scale);
  std::printf("%-10s %12s %10s\n", "recipe", "time [ms]", "TFLOP/s");
  std::vector<Result> results;
  for (qmesh::Recipe recipe : {qmesh::Recipe::kBf16, qmesh::Recipe::kFp8Delayed}) {
    results.push_back(measure(recipe, tokens, h, f, iters, device));
    std::printf("%-10s %12.2f %10.4f\n", results.back().recipe.c_str(),
                1e3 * results.back().seconds, results.back().tflops);
  }
  const double ratio = results[0].seconds / results[1].seconds;
  std::printf("\nFP8 speed-up over BF16: %.2fx\n", ratio);
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"device\": \"" << device.str() << "\", \"tokens\": " << tokens
        << ", \"hidden\": " << h << ", \"ffn\": " << f << ", \"results\": [";
    for (size_t i = 0; i < results.size(); ++i)
      out << (i ? ", " : "") << "{\"recipe\": \"" << results[i].recipe
          << "\", \"seconds\": " << results[i].seconds << ", \"tflops\": " << results[i].tflops
          << "}";
    out << "], \"fp8_speedup\": " << ratio << "}\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "dense_bench: %s\n", e.what());
  return 1;
}
