// train_mlp: trains a stack of LayerNormMLP blocks with data x tensor parallelism and FP8
// (or BF16) GEMMs on a synthetic teacher task, one MPI rank per process, on the CPU or one
// GPU per rank (--device). See --help and docs/train_mlp.md.
#include <algorithm>
#include <boost/program_options/errors.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "options.h"
#include "plot.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/comm/mpi.h"
#include "qmesh/config.h"
#include "qmesh/copy.h"
#include "qmesh/error.h"
#include "qmesh/layers/fp8_stats.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/owned_stream.h"
#include "qmesh/train/checkpoint.h"
#include "qmesh/train/grad_sync.h"
#include "qmesh/train/loss.h"
#include "qmesh/train/optimizer.h"
#include "qmesh/version.h"
#include "teacher.h"
#include "timed_comm.h"
#if QMESH_WITH_NCCL
#include <cuda_runtime_api.h>

#include "qmesh/comm/nccl.h"
#endif

namespace train_mlp {
namespace {

using Clock = std::chrono::steady_clock;

// The parameters that GradSync reduces: all but the fsdp-sharded ones (their backward does).
std::vector<qmesh::Parameter*> replicated(const std::vector<qmesh::Parameter*>& params) {
  std::vector<qmesh::Parameter*> out;
  for (auto* p : params)
    if (!p->fsdp_sharded()) out.push_back(p);
  return out;
}

class Model {
 public:
  Model(const Options& o, qmesh::LayerContext& ctx) {
    for (int l = 0; l < o.layers; ++l)
      blocks_.emplace_back(
          "block" + std::to_string(l), o.hidden, o.ffn,
          qmesh::LayerNormMLPOptions{
              o.sequence_parallel, 1e-5f, std::nullopt,
              o.regather_input ? qmesh::GatheredInput::kRegather : qmesh::GatheredInput::kSave},
          ctx, o.seed + 1000 * uint64_t(l + 1));
  }
  qmesh::TensorView forward(qmesh::TensorView x) {
    for (auto& b : blocks_) x = b.forward(x);
    return x;
  }
  // Backward, handing each block's gradients to `sync` as soon as they are final.
  void backward(qmesh::TensorView dy, qmesh::GradSync& sync) {
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
      dy = it->backward(dy);
      sync.ready(replicated(it->parameters()));
    }
  }
  // In the order gradients become ready (last block first).
  std::vector<qmesh::Parameter*> parameters() {
    std::vector<qmesh::Parameter*> out;
    for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it)
      for (auto* p : it->parameters()) out.push_back(p);
    return out;
  }

 private:
  std::vector<qmesh::LayerNormMLP> blocks_;
};

// FNV-1a over the raw bytes of this rank's tp-local parameters (fsdp shards gathered back,
// so that every dp x fsdp split of a run prints the same checksums). Collective over fsdp.
uint32_t checksum(const std::vector<qmesh::Parameter*>& params, const qmesh::FsdpGroup& fsdp) {
  uint32_t h = 2166136261u;
  for (const auto* p : params) {
    const qmesh::Tensor host = fsdp.full_value(*p);
    const auto* b = static_cast<const uint8_t*>(host.data());
    for (size_t i = 0; i < host.nbytes(); ++i) h = (h ^ b[i]) * 16777619u;
  }
  return h;
}

// Where this rank sits among the ranks of its host (collective over the world, once).
struct NodeLayout {
  int local_rank = 0;      // position among the ranks of this rank's host
  int ranks_per_node = 1;  // ranks on the fullest host
};

NodeLayout node_layout(qmesh::Communicator& world) {
  const std::vector<int> hosts = world.host_ids();
  std::map<int, int> per_host;
  NodeLayout node;
  for (int r = 0; r < world.size(); ++r) {
    const int count = ++per_host[hosts[size_t(r)]];
    if (r == world.rank()) node.local_rank = count - 1;
    node.ranks_per_node = std::max(node.ranks_per_node, count);
  }
  return node;
}

// The communicator the layers compute over, and their device: the MPI world on the CPU; with
// --device cuda, an NCCL world (bootstrapped over MPI), one GPU per rank (its local rank).
std::shared_ptr<qmesh::Communicator> compute_world(
    const Options& o, const NodeLayout& node, const std::shared_ptr<qmesh::Communicator>& world,
    qmesh::Device& device) {
  device = qmesh::Device::host();
  if (o.device != DeviceChoice::kCuda) return world;
#if QMESH_WITH_NCCL
  device = qmesh::Device::cuda(node.local_rank);  // validate() saw a GPU for every rank
  const cudaError_t set = cudaSetDevice(device.index);
  QMESH_CHECK(set == cudaSuccess, "cannot use ", device.str(), ": ", cudaGetErrorString(set));
  const auto bootstrap = qmesh::make_mpi_bootstrap();
  return qmesh::make_nccl_world(*bootstrap);
#else
  (void)node;
  QMESH_THROW("--device cuda needs qmesh built with NCCL");
#endif
}

// `host` itself when the layers run on the host; else `staging` on `device`, holding a copy.
// Blocking (cudaMemcpy on the legacy default stream, ordered with the streams of Streams).
qmesh::TensorView placed(const qmesh::Tensor& host, qmesh::Tensor& staging, qmesh::Device device) {
  if (device.is_host()) return host;
  if (staging.data() == nullptr) staging = qmesh::Tensor(host.dtype(), host.shape(), device);
  qmesh::copy_tensor(staging, host);
  return staging;
}

// Runs fn on every rank; if it throws on any rank, every rank exits with status 1 at once,
// instead of the others waiting in the next collective until timeout. A failing rank prints
// its message before the others can learn of the failure (the all-reduce needs it), so that
// mpirun, which tears the job down at the first non-zero exit, cannot swallow the message.
void all_ranks_or_exit(qmesh::Communicator& world, const std::function<void()>& fn) {
  qmesh::Tensor failed(qmesh::DType::kInt32, qmesh::Shape{1});
  std::string error;
  try {
    fn();
  } catch (const qmesh::Error& e) {
    error = e.message();
    std::fprintf(stderr, "train_mlp: rank %d: %s\n", world.rank(), error.c_str());
    std::fflush(stderr);
  }
  *failed.data_as<int32_t>() = error.empty() ? 0 : 1;
  world.all_reduce(failed, qmesh::ReduceOp::kMax);
  if (*failed.data_as<int32_t>() == 0) return;
  if (error.empty()) std::fprintf(stderr, "train_mlp: another rank failed (see its message)\n");
  std::fflush(stderr);
  std::_Exit(1);  // not MPI_Finalize: every rank stops here, none waits for the others
}

// The streams of the layers on CUDA: their kernels, copies and collectives run on `compute`;
// sequence-parallel layers move their chunks on `comm` meanwhile. Both synchronize with the
// legacy default stream, so the example's blocking copies need no extra synchronization.
struct Streams {
  explicit Streams(qmesh::Device device) : compute(device), comm(device) {}
  qmesh::OwnedStream compute, comm;
};

// --timing: this rank's totals over the timed steps.
struct StepTiming {
  int steps = 0;
  double step_s = 0;    // wall time of the steps
  double waited_s = 0;  // of which blocked in communication waits
};

// Collective over `world`. Rank 0 prints the mean step time split into compute (step time
// minus waits), exposed communication (the waits of the rank that waited least: transfer
// time nobody could avoid) and idle (the waits beyond that: waiting for slower ranks), each a
// mean over the ranks, in ms per step.
void report_timing(const StepTiming& mine, qmesh::Communicator& world) {
  qmesh::Tensor all(qmesh::DType::kFloat64, qmesh::Shape{world.size(), 2});
  qmesh::Tensor one(qmesh::DType::kFloat64, qmesh::Shape{1, 2});
  one.data_as<double>()[0] = mine.step_s;
  one.data_as<double>()[1] = mine.waited_s;
  world.all_gather(one, all);
  if (world.rank() != 0 || mine.steps == 0) return;
  const double* v = all.data_as<double>();
  const int n = world.size();
  double step = 0, waited = 0, least = v[1];
  for (int r = 0; r < n; ++r) {
    step += v[2 * r] / n;
    waited += v[2 * r + 1] / n;
    least = std::min(least, v[2 * r + 1]);
  }
  const double ms = 1e3 / mine.steps;
  std::printf(
      "timing: %d steps, per step %.3f ms = compute %.3f ms + exposed communication %.3f ms + "
      "idle %.3f ms\n",
      mine.steps, step * ms, (step - waited) * ms, least * ms, (waited - least) * ms);
}

// Options must have been validated against the world size.
int run(const Options& o, const NodeLayout& node,
        const std::shared_ptr<qmesh::Communicator>& world) {
  const bool root = world->rank() == 0;
  qmesh::Device device;
  std::shared_ptr<qmesh::Communicator> layers_world = compute_world(o, node, world, device);
  std::shared_ptr<TimedCommunicator> timed;  // --timing: every wait of the mesh is timed
  if (o.timing) layers_world = timed = std::make_shared<TimedCommunicator>(layers_world);
  const std::vector<qmesh::MeshAxis> axes{{"dp", o.dp}, {"fsdp", o.fsdp}, {"tp", o.tp}};
  qmesh::MeshResource roles;
  if (o.fsdp > 1) roles.fsdp = "fsdp";
  qmesh::Mesh mesh(layers_world, axes, roles);
  // Host-side reductions (the loss) run over MPI: a mesh of the MPI world when the layers'
  // mesh is NCCL's.
  std::optional<qmesh::Mesh> mpi_mesh;
  if (!device.is_host()) mpi_mesh.emplace(world, axes, roles);
  const qmesh::Mesh& host_mesh = mpi_mesh ? *mpi_mesh : mesh;
  const int tp = o.tp, tp_rank = mesh.coord("tp");
  std::optional<Streams> streams;
  if (!device.is_host()) streams.emplace(device);
  const qmesh::Stream stream = streams ? streams->compute.get() : qmesh::Stream{};
  qmesh::LayerContextOptions context_options;
  context_options.delayed.amax_history_len = o.amax_history;
  context_options.delayed.margin = o.margin;
  context_options.mxfp8.emulate = o.emulate;
  context_options.nvfp4.emulate = o.emulate;
  context_options.placement =
      qmesh::Placement{device, stream, streams ? streams->comm.get() : qmesh::Stream{}};
  context_options.overlap = o.overlap;
  context_options.fsdp = qmesh::FsdpOptions{false, o.fsdp_prefetch};
  qmesh::Fp8Stats fp8_stats;
  if (o.fp8_stats) {
    QMESH_CHECK(device.is_host(), "--fp8-stats needs the CPU backend (--device cpu)");
    context_options.fp8_stats = &fp8_stats;
  }
  qmesh::LayerContext ctx(mesh, o.recipe, context_options);
  Model model(o, ctx);
  auto params = model.parameters();
  std::unique_ptr<qmesh::Optimizer> opt =
      o.optimizer == "adamw" ? qmesh::make_adamw(params, {o.lr, 0.9f, 0.999f, 1e-8f, 0.0f}, stream)
                             : qmesh::make_sgd(params, {o.lr, 0.9f, 0.0f}, stream);
  // Data-parallel ranks: dp x fsdp, each with its own slice of the batch.
  const qmesh::FsdpGroup& fsdp = ctx.fsdp();
  const int data_rank = fsdp.data_rank(), data_ranks = o.dp * o.fsdp;
  qmesh::GradSync sync(
      fsdp.data_group(), replicated(params), 4u << 20, stream,
      o.rank_order ? qmesh::GradSyncOrder::kRankOrder : qmesh::GradSyncOrder::kBackend);
  examples::TeacherTask task(o.hidden, o.seed);

  // Tokens of this rank: its dp rank's batch, sliced over tp under sequence parallelism.
  const int64_t dp_tokens = o.batch * o.seq;
  const int64_t tokens = o.sequence_parallel ? dp_tokens / tp : dp_tokens;
  const int64_t first = data_rank * dp_tokens + (o.sequence_parallel ? tp_rank * tokens : 0);
  const double global_count = double(dp_tokens) * data_ranks * double(o.hidden);
  // Replicated outputs (no sequence parallelism) are summed over the data-parallel ranks only.
  auto loss_comm =
      o.sequence_parallel ? host_mesh.group({"dp", "fsdp", "tp"}) : host_mesh.group({"dp", "fsdp"});

  qmesh::Tensor config(qmesh::DType::kInt32, qmesh::Shape{8});
  const int32_t cfg[8] = {o.dp,
                          o.fsdp,
                          o.tp,
                          o.layers,
                          int32_t(o.hidden),
                          int32_t(o.ffn),
                          int32_t(o.recipe),
                          int32_t(o.sequence_parallel)};
  std::copy(cfg, cfg + 8, config.data_as<int32_t>());
  const qmesh::CheckpointContent ckpt =
      qmesh::training_checkpoint(ctx, params, *opt, {{"run.config", config}});

  int start = 0;
  if (o.resume) {
    all_ranks_or_exit(*world, [&] {
      QMESH_CHECK(std::filesystem::exists(std::filesystem::path(o.checkpoint_dir) / "latest"),
                  "no checkpoint to resume from in ", o.checkpoint_dir, ": run once with ",
                  "--checkpoint-dir ", o.checkpoint_dir, " first, or drop --resume");
      start = qmesh::load_checkpoint(o.checkpoint_dir, ckpt, *world);
      // dp and fsdp may differ: the shards were resharded.
      QMESH_CHECK(std::equal(cfg + 2, cfg + 8, config.data_as<int32_t>() + 2), "the checkpoint in ",
                  o.checkpoint_dir, " was written by a run with another tp/layers/hidden/",
                  "ffn/recipe/sequence-parallel configuration");
    });
    if (root) std::printf("resumed from %s at step %d\n", o.checkpoint_dir.c_str(), start);
  }
  const double baseline = task.mean_predictor_loss();
  const double flops_per_step =
      12.0 * double(dp_tokens) * data_ranks * double(o.hidden) * double(o.ffn) * o.layers;
  if (root) {
    std::printf("%s\n", qmesh::build_info().c_str());
    std::printf(
        "train_mlp: %d ranks = dp %d x fsdp %d x tp %d%s on %s, %d x LayerNormMLP(hidden %lld, ffn "
        "%lld), recipe %s, %lld tokens/step, %d steps\n",
        world->size(), o.dp, o.fsdp, o.tp, o.sequence_parallel ? " (sequence parallel)" : "",
        device.is_host() ? "the CPU" : "CUDA (one GPU per rank, NCCL)", o.layers,
        (long long)o.hidden, (long long)o.ffn, std::string(qmesh::recipe_name(o.recipe)).c_str(),
        (long long)(dp_tokens * data_ranks), o.steps);
    std::printf("loss of predicting the mean: %.6f\n", baseline);
    const std::vector<int>& hosts = host_mesh.host_ids();
    std::printf("hosts: %d, at most %d ranks each; tp groups %s\n",
                *std::max_element(hosts.begin(), hosts.end()) + 1, node.ranks_per_node,
                host_mesh.axis_spans_hosts("tp") ? "span hosts" : "inside one host");
  }
  std::ofstream csv;
  if (root && !o.csv.empty()) {
    csv.open(o.csv, o.resume ? std::ios::app : std::ios::trunc);
    QMESH_CHECK(csv.good(), "cannot write --csv file ", o.csv);
    if (!o.resume) csv << "step,loss\n";
  }

  // Data and targets are generated on the host (the teacher is host code) and copied to the
  // device; the loss and dL/dy are computed where the layers run, and only the local sum of
  // squared errors comes back to the host, to be summed over the ranks.
  qmesh::Tensor x(qmesh::DType::kFloat32, qmesh::Shape{tokens, o.hidden});
  qmesh::Tensor t(x.dtype(), x.shape()), x_dev, t_dev;
  qmesh::Tensor dy(x.dtype(), x.shape(), device);
  qmesh::Tensor loss_sum(qmesh::DType::kFloat64, qmesh::Shape{1});
  qmesh::Tensor local_sum(loss_sum.dtype(), loss_sum.shape(), device);
  const auto begin = Clock::now();
  auto window_start = begin;
  double loss = 0;
  StepTiming timing;
  for (int step = start + 1; step <= o.steps; ++step) {
    // The first step (allocations, first touches) is left out of --timing unless it is all.
    const bool timed_step = timed && (step > start + 1 || step == o.steps);
    const auto step_start = Clock::now();
    const double waited_before = timed ? timed->waited_s() : 0.0;
    task.batch(step, first, x, t);
    // Both copies before the step's work is queued: a blocking copy waits for that work.
    const qmesh::TensorView x_in = placed(x, x_dev, device), t_in = placed(t, t_dev, device);
    const qmesh::TensorView y = model.forward(x_in);
    qmesh::mse_loss(y, t_in, global_count, dy, local_sum, stream);
    model.backward(dy, sync);
    sync.finish();
    ctx.end_step();  // the step's one amax all-reduce and scale update (FP8 delayed)
    opt->step();
    qmesh::copy_tensor(loss_sum, local_sum);  // on CUDA: waits for the whole step
    loss_comm->all_reduce(loss_sum, qmesh::ReduceOp::kSum);
    loss = *loss_sum.data_as<double>() / global_count;
    QMESH_CHECK(std::isfinite(loss), "the loss became ", loss, " at step ", step,
                "; lower --lr or use --recipe bf16 to check the model");
    if (timed_step) {
      timing.steps += 1;
      timing.step_s += std::chrono::duration<double>(Clock::now() - step_start).count();
      timing.waited_s += timed->waited_s() - waited_before;
    }
    if (root && csv.is_open()) csv << step << "," << std::scientific << loss << "\n";
    if (root && (step % o.log_every == 0 || step == o.steps)) {
      const auto now = Clock::now();
      const double window = std::chrono::duration<double>(now - window_start).count();
      const int steps_in_window = step % o.log_every == 0 ? o.log_every : step % o.log_every;
      window_start = now;
      std::printf("step %5d  loss %.6f  %9.0f tokens/s  %7.3f TFLOP/s  %7.1f s\n", step, loss,
                  double(dp_tokens * data_ranks) * steps_in_window / window,
                  flops_per_step * steps_in_window / window / 1e12,
                  std::chrono::duration<double>(now - begin).count());
      std::fflush(stdout);
    }
    const bool last = step == o.steps;
    if (!o.checkpoint_dir.empty() &&
        (last || (o.checkpoint_every > 0 && step % o.checkpoint_every == 0))) {
      qmesh::synchronize(device, stream);  // the step's updates are complete before saving
      qmesh::save_checkpoint(o.checkpoint_dir, step, ckpt, *world);
    }
  }
  if (timed) report_timing(timing, *world);
  // Every rank's parameter checksum, to compare runs bit for bit.
  qmesh::Tensor sums(qmesh::DType::kInt32, qmesh::Shape{world->size()});
  qmesh::Tensor mine(qmesh::DType::kInt32, qmesh::Shape{1});
  *mine.data_as<int32_t>() = int32_t(checksum(params, fsdp));
  world->all_gather(mine, sums);
  if (root) {
    std::printf("final loss %.6f (predicting the mean: %.6f, ratio %.3f)\nparameter checksums:",
                loss, baseline, loss / baseline);
    for (int r = 0; r < world->size(); ++r)
      std::printf(" %08x", uint32_t(sums.data_as<int32_t>()[r]));
    std::printf("\n");
    if (o.fp8_stats)
      std::printf("FP8 operands of rank 0 (in the order the layers cast them):\n%s",
                  fp8_stats.operands().empty() ? "(none: the recipe is not FP8)\n"
                                               : fp8_stats.report().c_str());
    if (csv.is_open()) csv.close();
    if (!o.plot.empty()) {
      std::vector<std::string> files = o.compare;
      files.push_back(o.csv);
      plot_loss_curves(files, o.plot);
      std::printf("loss curves plotted to %s\n", o.plot.c_str());
    }
  }
  return 0;
}

}  // namespace
}  // namespace train_mlp

int main(int argc, char** argv) {
  std::optional<train_mlp::Options> options;
  try {
    options = train_mlp::parse_options(argc, argv);
    if (!options) return 0;
  } catch (const boost::program_options::error& e) {
    std::fprintf(stderr, "train_mlp: %s (see --help)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    return 2;
  }
  try {
    qmesh::MpiSession mpi(&argc, &argv);
    auto world = qmesh::make_mpi_world();
    const train_mlp::NodeLayout node = train_mlp::node_layout(*world);
    try {
      train_mlp::validate(*options, world->size(), node.ranks_per_node);
      if (world->rank() == 0 && !options->cpu_reason.empty())
        std::printf("train_mlp: --device auto: training on the CPU backend: %s\n",
                    options->cpu_reason.c_str());
    } catch (const qmesh::Error& e) {  // the same on every rank: say it once, exit cleanly
      if (world->rank() == 0) std::fprintf(stderr, "train_mlp: %s\n", e.message().c_str());
      return 2;
    }
    return train_mlp::run(*options, node, world);
  } catch (const qmesh::Error& e) {
    // MpiSession did not finalize MPI (an error unwound through it): report and exit.
    std::fprintf(stderr, "train_mlp: %s\n", e.message().c_str());
    std::fflush(stderr);
    std::_Exit(1);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: %s\n", e.what());
    std::fflush(stderr);
    std::_Exit(1);
  }
}
