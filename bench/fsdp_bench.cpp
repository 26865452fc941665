// fsdp_bench: one training step (forward, backward, gradient reduction, AdamW) of a stack of
// LayerNormMLP blocks on N ranks of the local backend (threads), data parallel (dp = N) vs
// fully sharded (fsdp = N) with and without prefetch, BF16 and FP8 delayed scaling. Reports
// the median step time and, per rank, the bytes of parameters + gradients + optimizer state
// (what FSDP divides by N) and the bytes its weight all-gathers moved per step. Prints a
// table and, with --json FILE, the same numbers as JSON.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_options.h"
#include "counting_communicator.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/error.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/random.h"
#include "qmesh/train/grad_sync.h"
#include "qmesh/train/loss.h"
#include "qmesh/train/optimizer.h"
#include "qmesh/version.h"

namespace po = boost::program_options;

namespace {

struct Shape {
  int ranks, layers;
  int64_t tokens, hidden, ffn;  // tokens per rank
  int iters;
};

struct Mode {
  std::string name;
  bool fsdp;
  int prefetch;
};

struct Result {
  std::string mode, recipe;
  double seconds = 0;          // median step time
  int64_t state_bytes = 0;     // per rank: parameters + gradients + optimizer state
  int64_t gathered_bytes = 0;  // per rank and step: bytes sent into weight all-gathers
};

Result measure(const Shape& s, const Mode& mode, qmesh::Recipe recipe) {
  Result r{mode.name, std::string(qmesh::recipe_name(recipe))};
  qmesh::run_local_ranks(s.ranks, [&](qmesh::Communicator& comm) {
    // Counts the bytes this rank sends into all-gathers on every axis (the weight gathers).
    auto world = std::make_shared<qmesh::testing::CountingCommunicator>(
        std::shared_ptr<qmesh::Communicator>(&comm, [](qmesh::Communicator*) {}), true);
    qmesh::MeshResource roles;
    if (mode.fsdp) roles.fsdp = "fsdp";
    qmesh::Mesh mesh(world, {{"dp", mode.fsdp ? 1 : s.ranks}, {"fsdp", mode.fsdp ? s.ranks : 1}},
                     roles);
    qmesh::LayerContextOptions options;
    options.fsdp = qmesh::FsdpOptions{false, mode.prefetch};
    qmesh::LayerContext ctx(mesh, recipe, options);
    std::vector<qmesh::LayerNormMLP> blocks;
    for (int l = 0; l < s.layers; ++l)
      blocks.emplace_back("b" + std::to_string(l), s.hidden, s.ffn, qmesh::LayerNormMLPOptions{},
                          ctx, uint64_t(l + 1));
    std::vector<qmesh::Parameter*> all, replicated;
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it)
      for (auto* p : it->parameters()) {
        all.push_back(p);
        if (!p->fsdp_sharded()) replicated.push_back(p);
      }
    qmesh::GradSync sync(ctx.fsdp().data_group(), replicated);
    auto opt = qmesh::make_adamw(all, {});
    qmesh::Tensor x(qmesh::DType::kFloat32, qmesh::Shape{s.tokens, s.hidden});
    qmesh::Tensor t(x.dtype(), x.shape()), dy(x.dtype(), x.shape());
    qmesh::Tensor sum_sq(qmesh::DType::kFloat64, qmesh::Shape{1});
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data_as<float>()[i] = qmesh::counter_normal(uint64_t(comm.rank()) + 1, uint64_t(i));
      t.data_as<float>()[i] = qmesh::counter_normal(uint64_t(comm.rank()) + 100, uint64_t(i));
    }
    auto step = [&] {
      qmesh::TensorView h = x;
      for (auto& b : blocks) h = b.forward(h);
      qmesh::mse_loss(h, t, double(x.numel()) * s.ranks, dy, sum_sq);
      qmesh::TensorView g = dy;
      for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) {
        g = it->backward(g);
        std::vector<qmesh::Parameter*> ready;
        for (auto* p : it->parameters())
          if (!p->fsdp_sharded()) ready.push_back(p);
        sync.ready(ready);
      }
      sync.finish();
      ctx.end_step();
      opt->step();
    };
    step();  // warm-up: allocations, optimizer state
    std::vector<double> times;
    const int64_t gathered_before = world->all_gather_bytes();
    for (int i = 0; i < s.iters; ++i) {
      comm.barrier();
      const auto t0 = std::chrono::steady_clock::now();
      step();
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(times.begin(), times.end());
    if (comm.rank() != 0) return;
    r.seconds = times[times.size() / 2];
    r.gathered_bytes = (world->all_gather_bytes() - gathered_before) / s.iters;
    for (auto* p : all) r.state_bytes += int64_t(p->value.nbytes() + p->grad.nbytes());
    for (auto& [name, tensor] : opt->state()) r.state_bytes += int64_t(tensor->nbytes());
  });
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  Shape s{4, 4, 256, 512, 2048, 5};
  std::string json;
  po::options_description desc(
      "fsdp_bench: training step time and per-rank state bytes, data parallel vs FSDP\nOptions");
  desc.add_options()("help,h", "show this help")(
      "ranks", po::value(&s.ranks)->default_value(s.ranks), "ranks (threads of the local backend)")(
      "layers", po::value(&s.layers)->default_value(s.layers), "LayerNormMLP blocks")(
      "tokens", po::value(&s.tokens)->default_value(s.tokens), "tokens per rank and step")(
      "hidden", po::value(&s.hidden)->default_value(s.hidden), "hidden size")(
      "ffn", po::value(&s.ffn)->default_value(s.ffn), "MLP inner size")(
      "iters", po::value(&s.iters)->default_value(s.iters), "timed steps (median reported)")(
      "json", po::value(&json), "also write the results as JSON to this file");
  if (!bench::parse_options(argc, argv, desc)) return 0;
  QMESH_CHECK(
      s.ranks >= 1 && s.layers >= 1 && s.tokens >= 1 && s.hidden >= 1 && s.ffn >= 1 && s.iters >= 1,
      "--ranks, --layers, --tokens, --hidden, --ffn and --iters must be >= 1");
  std::printf(
      "%s\n%d ranks (local backend), %d x LayerNormMLP(hidden %lld, ffn %lld), %lld "
      "tokens per rank, AdamW\n\n",
      qmesh::build_info().c_str(), s.ranks, s.layers, (long long)s.hidden, (long long)s.ffn,
      (long long)s.tokens);
  std::printf("%-22s %-8s %12s %16s %18s\n", "mode", "recipe", "step [ms]", "state/rank [MB]",
              "gathered/step [MB]");
  const std::string n = std::to_string(s.ranks);
  const std::vector<Mode> modes{{"dp=" + n, false, 0},
                                {"fsdp=" + n + " prefetch 0", true, 0},
                                {"fsdp=" + n + " prefetch 1", true, 1}};
  std::vector<Result> results;
  for (qmesh::Recipe recipe : {qmesh::Recipe::kBf16, qmesh::Recipe::kFp8Delayed})
    for (const Mode& m : modes) {
      results.push_back(measure(s, m, recipe));
      const Result& r = results.back();
      std::printf("%-22s %-8s %12.2f %16.3f %18.3f\n", r.mode.c_str(), r.recipe.c_str(),
                  1e3 * r.seconds, double(r.state_bytes) / 1e6, double(r.gathered_bytes) / 1e6);
      std::fflush(stdout);
    }
  if (!json.empty()) {
    std::ofstream out(json);
    out << "{\"ranks\": " << s.ranks << ", \"layers\": " << s.layers << ", \"tokens\": " << s.tokens
        << ", \"hidden\": " << s.hidden << ", \"ffn\": " << s.ffn << ", \"results\": [";
    for (size_t i = 0; i < results.size(); ++i)
      out << (i ? ", " : "") << "{\"mode\": \"" << results[i].mode << "\", \"recipe\": \""
          << results[i].recipe << "\", \"seconds\": " << results[i].seconds
          << ", \"state_bytes\": " << results[i].state_bytes
          << ", \"gathered_bytes\": " << results[i].gathered_bytes << "}";
    out << "]}\n";
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "fsdp_bench: %s\n", e.what());
  return 1;
}
