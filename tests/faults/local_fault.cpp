// A fault trial on the local backend, whose 4 ranks are threads of this one process: a
// signal cannot stop one of them alone, so the victim stops itself at its first call into a
// communicator after `delay` ms — it freezes there for good, or its thread dies (unwinds and
// ends) — while the ranks train LayerNormMLP blocks on a dp 2 x tp 2 mesh (forward and
// backward with sequence-parallel collective-GEMM rings, the bucketed gradient sync, the
// amax reduction, an optimizer step, and with `checkpoint` a checkpoint written every step).
// The moment lands in mesh construction, any of these, or between them.
//
// Passes (exit 0) when every survivor fails with a qmesh::Error within 2 x the timeout of the
// fault, whose message says what timed out and names a peer rank, and (checkpoint) the newest
// complete checkpoint loads into a fresh model. Otherwise prints what went wrong and exits 1;
// on a hang (a survivor still running at 4 x the timeout) it first saves every thread's stack
// (gdb) to <work dir>.stacks.txt.
//
// usage: local_fault <train|checkpoint> <victim rank 0-3> <delay ms> <freeze|die>
//                    <timeout s> <work dir>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "intercepting_communicator.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/error.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/random.h"
#include "qmesh/train/checkpoint.h"
#include "qmesh/train/grad_sync.h"
#include "qmesh/train/optimizer.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace qmesh;

constexpr int kRanks = 4;

struct Trial {
  bool checkpoint = false;
  int victim = 0;
  Clock::time_point fault_at;
  bool freeze = true;
  std::string dir;
};

// The victim's thread unwinds with this when it "dies".
struct Died {};

struct Outcome {
  bool failed = false;
  Clock::time_point at;
  std::string message;
};

// The model every rank trains: two LayerNormMLP blocks (FP8 delayed scaling, sequence
// parallel with ring collective GEMMs) on a dp 2 x tp 2 mesh over `comm`, and what its
// checkpoints hold.
struct Model {
  explicit Model(const std::shared_ptr<Communicator>& comm)
      : mesh(comm, {{"dp", 2}, {"tp", 2}}),
        ctx(mesh, Recipe::kFp8Delayed, {.overlap = Overlap::kRing}) {
    LayerNormMLPOptions options;
    options.sequence_parallel = true;
    for (int b = 0; b < 2; ++b)
      blocks.emplace_back("block" + std::to_string(b), 32, 64, options, ctx, uint64_t(b + 1));
    for (auto& block : blocks)
      for (Parameter* p : block.parameters()) params.push_back(p);
    checkpoint = {{}, &ctx, MeshLayout{2, 1, 2}, {}};
    for (Parameter* p : params) checkpoint.tensors.push_back({p->name, p->value});
  }
  Mesh mesh;
  LayerContext ctx;
  std::vector<LayerNormMLP> blocks;
  std::vector<Parameter*> params;
  CheckpointContent checkpoint;
};

// Trains until a communicator call fails (or, for the victim, until the fault).
void train(const Trial& trial, const std::shared_ptr<Communicator>& world) {
  auto stop_here = [&trial](testing::InterceptingCommunicator::Call, int64_t) {
    if (Clock::now() < trial.fault_at) return;
    if (!trial.freeze) throw Died{};
    for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  };
  std::shared_ptr<Communicator> comm = world;
  if (world->rank() == trial.victim)
    comm = std::make_shared<testing::InterceptingCommunicator>(world, stop_here, true);
  Model model(comm);
  auto opt = make_sgd(model.params, {0.01f, 0.9f, 0.0f});
  GradSync sync(model.mesh.axis("dp"), model.params, 1 << 12);
  Tensor x(DType::kFloat32, Shape{8, 32}), dy(x.dtype(), x.shape());
  for (int step = 0;; ++step) {
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data_as<float>()[i] = counter_normal(uint64_t(step), uint64_t(world->rank() * 1000 + i));
      dy.data_as<float>()[i] = 0.01f * x.data_as<float>()[i];
    }
    TensorView h = x;
    for (auto& block : model.blocks) h = block.forward(h);
    TensorView g = dy;
    for (auto it = model.blocks.rbegin(); it != model.blocks.rend(); ++it) {
      g = it->backward(g);
      sync.ready(it->parameters());
    }
    sync.finish();
    model.ctx.end_step();
    opt->step();
    if (trial.checkpoint) save_checkpoint(trial.dir, step, model.checkpoint, *comm);
  }
}

// The newest complete checkpoint in `dir` (if any was written) loads into a fresh model.
std::string newest_checkpoint_problem(const std::string& dir) {
  if (!std::filesystem::exists(std::filesystem::path(dir) / "latest")) return {};
  try {
    run_local_ranks(kRanks, [&](Communicator& world) {
      Model model(std::shared_ptr<Communicator>(&world, [](Communicator*) {}));
      load_checkpoint(dir, model.checkpoint, world);
    });
  } catch (const std::exception& e) {
    return std::string("the newest checkpoint does not load: ") + e.what();
  }
  return {};
}

int usage(const char* argv0) {
  std::fprintf(stderr,
               "usage: %s <train|checkpoint> <victim rank 0-3> <delay ms> <freeze|die> "
               "<timeout s> <work dir>\n",
               argv0);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 7) return usage(argv[0]);
  const std::string workload = argv[1], how = argv[4];
  Trial trial;
  trial.checkpoint = workload == "checkpoint";
  trial.victim = std::atoi(argv[2]);
  trial.freeze = how == "freeze";
  trial.dir = argv[6];
  const double timeout_s = std::atof(argv[5]);
  if ((workload != "train" && !trial.checkpoint) || (how != "freeze" && how != "die") ||
      trial.victim < 0 || trial.victim >= kRanks || !(timeout_s > 0))
    return usage(argv[0]);
  setenv("QMESH_COMM_TIMEOUT_S", argv[5], 1);
  trial.fault_at = Clock::now() + std::chrono::milliseconds(std::atoi(argv[3]));

  const auto world = make_local_world(kRanks);
  std::mutex mu;  // guards outcomes and left
  std::vector<Outcome> outcomes(kRanks);
  int left = kRanks - 1;
  for (int r = 0; r < kRanks; ++r) {
    // Detached: a frozen victim never returns; the process exits without joining it.
    std::thread([&, r] {
      try {
        train(trial, world[size_t(r)]);
      } catch (const Died&) {
        return;
      } catch (const std::exception& e) {
        if (r == trial.victim) return;
        std::lock_guard lock(mu);
        outcomes[size_t(r)] = {true, Clock::now(), e.what()};
        --left;
      }
    }).detach();
  }
  const auto limit = std::chrono::duration<double>(2 * timeout_s);
  for (;;) {
    {
      std::lock_guard lock(mu);
      if (left == 0) break;
    }
    if (Clock::now() > trial.fault_at + 2 * limit) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard lock(mu);
  if (left > 0) {  // a hang: keep every thread's stack (the ranks are threads of this process)
    const std::string stacks = trial.dir + ".stacks.txt";
    const std::string gdb = "gdb -p " + std::to_string(getpid()) +
                            " -batch -ex 'thread apply all bt' >'" + stacks + "' 2>&1";
    std::printf("hang: the stacks of every thread are in %s (exit status of gdb: %d)\n",
                stacks.c_str(), std::system(gdb.c_str()));
  }
  int bad = 0;
  for (int r = 0; r < kRanks; ++r) {
    if (r == trial.victim) continue;
    const Outcome& o = outcomes[size_t(r)];
    std::string problem;
    if (!o.failed)
      problem = "still running at 4 x the timeout (a hang)";
    else if (o.at - trial.fault_at > limit)
      problem = "left after more than 2 x the timeout";
    else if (o.message.find("timed out") == std::string::npos ||
             o.message.find("peer rank") == std::string::npos)
      problem = "its error does not say what timed out and which peer rank it waited for";
    std::printf("rank %d: %s%s%s\n", r, problem.empty() ? "ok: " : "FAIL: ", problem.c_str(),
                o.failed ? (" -- " + o.message).c_str() : "");
    bad += problem.empty() ? 0 : 1;
  }
  if (trial.checkpoint && bad == 0) {
    const std::string problem = newest_checkpoint_problem(trial.dir);
    std::printf("checkpoint: %s%s\n", problem.empty() ? "ok" : "FAIL: ", problem.c_str());
    bad += problem.empty() ? 0 : 1;
  }
  std::fflush(stdout);
  std::_Exit(bad == 0 ? 0 : 1);
}
