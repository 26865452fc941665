// dense_bench: forward + backward time of one LayerNormMLP block in BF16 and FP8 (delayed
// scaling), one rank, on the host backend (the layers run on the host). Prints a table and,
// with --json FILE, the same numbers as JSON.
//
// The target shape is batch 4 x seq 2048 tokens, hidden 4096, ffn 16384 (about 6.6 TFLOP
// per step): far too much for a small CPU, so --scale S divides tokens, hidden and ffn by S
// (default 8 on the host).
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <vector>

#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/error.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/random.h"
#include "qmesh/version.h"

namespace po = boost::program_options;

namespace {

struct Result {
  std::string recipe;
  double seconds;  // median forward + backward time
  double tflops;
};

Result measure(qmesh::Recipe recipe, int64_t tokens, int64_t hidden, int64_t ffn, int iters) {
  Result r{std::string(qmesh::recipe_name(recipe)), 0, 0};
  qmesh::run_local_ranks(1, [&](qmesh::Communicator& comm) {
    const std::shared_ptr<qmesh::Communicator> world(&comm, [](qmesh::Communicator*) {});
    qmesh::Mesh mesh(world, {{"dp", 1}, {"tp", 1}});
    qmesh::LayerContext ctx(mesh, recipe);
    qmesh::LayerNormMLP block("mlp", hidden, ffn, {}, ctx, 1);
    qmesh::Tensor x(qmesh::DType::kFloat32, qmesh::Shape{tokens, hidden}), dy(x.dtype(), x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data_as<float>()[i] = qmesh::counter_normal(1, uint64_t(i));
      dy.data_as<float>()[i] = 1e-3f * qmesh::counter_normal(2, uint64_t(i));
    }
    std::vector<double> times;
    for (int i = 0; i < iters + 1; ++i) {  // the first iteration warms up (allocations)
      const auto t0 = std::chrono::steady_clock::now();
      block.forward(x);
      block.backward(dy);
      ctx.end_step();
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (i > 0) times.push_back(s);
    }
    std::sort(times.begin(), times.end());
    r.seconds = times[times.size() / 2];
  });
  r.tflops = 12.0 * double(tokens) * double(hidden) * double(ffn) / r.seconds / 1e12;
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t batch = 4, seq = 2048, hidden = 4096, ffn = 16384, scale = 8;
  int iters = 3;
  std::string json;
  po::options_description desc(
      "dense_bench: forward + backward of one LayerNormMLP block, BF16 vs FP8 delayed scaling\n"
      "Options");
  desc.add_options()("help,h", "show this help")("batch", po::value(&batch)->default_value(batch),
                                                 "sequences")(
      "seq", po::value(&seq)->default_value(seq), "tokens per sequence")(
      "hidden", po::value(&hidden)->default_value(hidden), "hidden size")(
      "ffn", po::value(&ffn)->default_value(ffn), "MLP inner size")(
      "scale", po::value(&scale)->default_value(scale),
      "divide tokens, hidden and ffn by this (1: the full shape)")(
      "iters", po::value(&iters)->default_value(iters), "timed iterations (median reported)")(
      "json", po::value(&json), "also write the results as JSON to this file");
  po::variables_map vm;
  po::store(po::parse_command_line(argc, argv, desc), vm);
  if (vm.count("help")) {
    std::cout << desc << "\n";
    return 0;
  }
  po::notify(vm);
  QMESH_CHECK(scale >= 1 && iters >= 1, "--scale and --iters must be >= 1");
  const int64_t tokens = batch * seq / scale, h = hidden / scale, f = ffn / scale;
  QMESH_CHECK(tokens >= 1 && h >= 1 && f >= 1, "--scale ", scale, " leaves an empty shape");
  std::printf(
      "%s\nLayerNormMLP forward+backward, %lld tokens, hidden %lld, ffn %lld (scale 1/%lld)\n\n",
      qmesh::build_info().c_str(), (long long)tokens, (long long)h, (long long)f, (long long)scale);
  std::printf("%-10s %12s %10s\n", "recipe", "time [ms]", "TFLOP/s");
  std::vector<Result> results;
  for (qmesh::Recipe recipe : {qmesh::Recipe::kBf16, qmesh::Recipe::kFp8Delayed}) {
    results.push_back(measure(recipe, tokens, h, f, iters));
    std::printf("%-10s %12.2f %10.4f\n", results.back().recipe.c_str(),
                1e3 * results.back().seconds, results.back().tflops);
  }
  const double ratio = results[0].seconds / results[1].seconds;
  std::printf("\nFP8 speed-up over BF16: %.2fx\n", ratio);
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"tokens\": " << tokens << ", \"hidden\": " << h << ", \"ffn\": " << f
        << ", \"results\": [";
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
