// The training loop of examples/train_mlp on CUDA, with the pieces it uses (LayerNormMLP,
// mse_loss, GradSync, AdamW, delayed scaling, two OwnedStreams per rank): on one rank, and on
// tp = 2 local-backend threads sharing the GPU with sequence parallelism and ring overlap.
// Checks that training 20 steps equals training 10, saving a checkpoint with qmesh's
// checkpoint code (save_tensors for the parameters and optimizer state, save_scaling_states
// for the FP8 scaling state), loading it into a fresh model (load_tensors,
// load_scaling_states) and training 10 more, bit for bit, and that the CUDA run learns like
// the host run. Every case also runs on the host, so
// the test's own logic is exercised without a GPU; the CUDA cases skip there.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/copy.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/owned_stream.h"
#include "qmesh/scaling/checkpoint.h"
#include "qmesh/tensor_file.h"
#include "qmesh/train/grad_sync.h"
#include "qmesh/train/loss.h"
#include "qmesh/train/optimizer.h"

namespace qmesh {
namespace {

using testing_mlp::borrowed;
using testing_mlp::sample;

constexpr int64_t kTokens = 64, kHidden = 64, kFfn = 128;  // FP8 on CUDA: multiples of 16
constexpr uint64_t kSeed = 11;

struct TrainCase {
  Recipe recipe = Recipe::kBf16;
  int tp = 1;  // tp > 1: sequence parallel with ring overlap
  Device device;
};

std::string case_name(const TrainCase& c) {
  return std::string(recipe_name(c.recipe)) + " tp " + std::to_string(c.tp) + " on " +
         c.device.str();
}

// What a checkpoint holds (parameters, optimizer state, delayed-scaling state), copied to the
// host. In memory, not through the checkpoint files: those need zlib, which a GPU machine may
// lack (the file formats are tested on their own).

// One rank of the training run: a LayerNormMLP block trained with AdamW on a fixed teacher
// (target = 0.5 x), the loss computed where the block runs.
class Trainer {
 public:
  Trainer(Communicator& comm, const TrainCase& c)
      : c_(c),
        mesh_(borrowed(comm), {{"dp", 1}, {"tp", comm.size()}}),
        compute_(stream_on(c.device)),
        comm_stream_(stream_on(c.device)),
        ctx_(mesh_, c.recipe,
             {.placement = Placement{c.device, stream_of(compute_), stream_of(comm_stream_)},
              .overlap = Overlap::kRing}),
        block_("block", kHidden, kFfn,
               LayerNormMLPOptions{c.tp > 1, 1e-5f, std::nullopt, GatheredInput::kSave}, ctx_,
               kSeed),
        params_(block_.parameters()),
        opt_(make_adamw(params_, {1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f}, stream())),
        sync_(mesh_.axis("dp"), params_, 4u << 20, stream()),
        local_tokens_(kTokens / c.tp),
        x_(DType::kFloat32, Shape{local_tokens_, kHidden}, c.device),
        t_(x_.dtype(), x_.shape(), c.device),
        dy_(x_.dtype(), x_.shape(), c.device),
        sum_(DType::kFloat64, Shape{1}, c.device) {}

  // One training step on the global batch of `step`; returns this rank's sum of squared
  // errors.
  double step(int step) {
    const int64_t first = mesh_.coord("tp") * local_tokens_;
    const std::vector<double> all = sample(kSeed + 1, step, kTokens * kHidden);
    Tensor x(DType::kFloat32, x_.shape()), t(DType::kFloat32, x_.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data_as<float>()[i] = float(all[size_t(first * kHidden + i)]);
      t.data_as<float>()[i] = 0.5f * x.data_as<float>()[i];
    }
    copy_tensor(x_, x);  // blocking, ordered with the streams (they are blocking streams)
    copy_tensor(t_, t);
    const TensorView y = block_.forward(x_);
    mse_loss(y, t_, double(kTokens * kHidden), dy_, sum_, stream());
    block_.backward(dy_);
    sync_.ready(params_);
    sync_.finish();
    ctx_.end_step();
    opt_->step();
    return *clone(sum_, Device::host()).data_as<double>();  // waits for the step
  }

  // Writes this rank's checkpoint into `dir` (<dir>/tensors-<rank>, <dir>/scaling-<rank>).
  void save_checkpoint(const std::filesystem::path& dir) {
    synchronize(c_.device, stream());
    save_tensors(tensor_file(dir), named_state());
    if (c_.recipe == Recipe::kFp8Delayed) save_scaling_states(ctx_.scaling(), scaling_file(dir));
  }

  void load_checkpoint(const std::filesystem::path& dir) {
    load_tensors(tensor_file(dir), named_state());
    if (c_.recipe == Recipe::kFp8Delayed) load_scaling_states(ctx_.scaling(), scaling_file(dir));
  }

  // The local shards' bytes, to compare runs bit for bit.
  std::vector<uint8_t> parameter_bytes() {
    synchronize(c_.device, stream());
    std::vector<uint8_t> bytes;
    for (const Parameter* p : params_) {
      const Tensor host = clone(p->value, Device::host());
      const auto* b = static_cast<const uint8_t*>(host.data());
      bytes.insert(bytes.end(), b, b + host.nbytes());
    }
    return bytes;
  }

 private:
  static std::optional<OwnedStream> stream_on(Device device) {
    if (device.is_host()) return std::nullopt;
    return OwnedStream(device);
  }
  static Stream stream_of(const std::optional<OwnedStream>& s) { return s ? s->get() : Stream{}; }
  Stream stream() const { return stream_of(compute_); }

  // Parameters and optimizer state, by name.
  std::vector<NamedTensor> named_state() {
    std::vector<NamedTensor> out;
    for (Parameter* p : params_) out.push_back({p->name, p->value});
    for (auto& [name, t] : opt_->state()) out.push_back({name, *t});
    return out;
  }
  std::string tensor_file(const std::filesystem::path& dir) const {
    return (dir / ("tensors-" + std::to_string(mesh_.world()->rank()))).string();
  }
  std::string scaling_file(const std::filesystem::path& dir) const {
    return (dir / ("scaling-" + std::to_string(mesh_.world()->rank()))).string();
  }

  TrainCase c_;
  Mesh mesh_;
  std::optional<OwnedStream> compute_, comm_stream_;
  LayerContext ctx_;
  LayerNormMLP block_;
  std::vector<Parameter*> params_;
  std::unique_ptr<Optimizer> opt_;
  GradSync sync_;
  int64_t local_tokens_;
  Tensor x_, t_, dy_, sum_;
};

struct RunResult {
  std::vector<double> losses;  // global loss per step (rank 0's view)
  std::vector<uint8_t> rank0_parameters;
};

// Trains `steps` steps; with resume_at > 0, stops after resume_at steps, saves a checkpoint,
// builds a fresh trainer, loads the checkpoint into it and trains the remaining steps.
// A fresh directory for one case's checkpoint.
std::filesystem::path checkpoint_dir(const TrainCase& c) {
  std::string name = "qmesh_training_test_" + std::to_string(getpid()) + "_" + case_name(c);
  std::replace_if(
      name.begin(), name.end(), [](char ch) { return ch == ' ' || ch == ':'; }, '_');
  return std::filesystem::temp_directory_path() / name;
}

RunResult train(const TrainCase& c, int steps, int resume_at = 0) {
  RunResult result;
  result.losses.assign(size_t(steps), 0.0);
  run_local_ranks(c.tp, [&](Communicator& comm) {
    auto trainer = std::make_unique<Trainer>(comm, c);
    Tensor loss(DType::kFloat64, Shape{1});
    for (int s = 0; s < steps; ++s) {
      if (resume_at > 0 && s == resume_at) {
        const std::filesystem::path dir = checkpoint_dir(c);
        if (comm.rank() == 0) std::filesystem::create_directories(dir);
        comm.barrier();
        trainer->save_checkpoint(dir);
        trainer = std::make_unique<Trainer>(comm, c);
        trainer->load_checkpoint(dir);
        comm.barrier();
        if (comm.rank() == 0) std::filesystem::remove_all(dir);
      }
      *loss.data_as<double>() = trainer->step(s);
      comm.all_reduce(loss, ReduceOp::kSum);
      if (comm.rank() == 0)
        result.losses[size_t(s)] = *loss.data_as<double>() / (kTokens * kHidden);
    }
    const std::vector<uint8_t> bytes = trainer->parameter_bytes();
    if (comm.rank() == 0) result.rank0_parameters = bytes;
  });
  return result;
}

std::vector<TrainCase> cases(Device device) {
  std::vector<TrainCase> out;
  for (Recipe r : {Recipe::kBf16, Recipe::kFp8Delayed, Recipe::kFp8Current})
    for (int tp : {1, 2}) out.push_back({r, tp, device});
  return out;
}

bool skip_without_gpu() { return cuda_device_count() == 0; }

void expect_resume_is_exact(Device device) {
  for (const TrainCase& c : cases(device)) {
    SCOPED_TRACE(case_name(c));
    const RunResult straight = train(c, 20), resumed = train(c, 20, 10);
    EXPECT_EQ(resumed.losses, straight.losses);
    EXPECT_TRUE(resumed.rank0_parameters == straight.rank0_parameters)
        << "the parameters after 10 + 10 steps differ from those after 20";
  }
}

TEST(TrainingHost, ResumeIsExact) { expect_resume_is_exact(Device::host()); }

TEST(TrainingGpu, ResumeIsExact) {
  if (skip_without_gpu()) GTEST_SKIP() << "no CUDA device";
  expect_resume_is_exact(Device::cuda(0));
}

// The CUDA run learns, and its loss curve stays near the host run's (the GEMMs round and
// accumulate differently, so the curves are not identical).
TEST(TrainingGpu, LearnsLikeTheHost) {
  if (skip_without_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const TrainCase& c : cases(Device::cuda(0))) {
    SCOPED_TRACE(case_name(c));
    TrainCase on_host = c;
    on_host.device = Device::host();
    const RunResult gpu = train(c, 30), host = train(on_host, 30);
    EXPECT_LT(gpu.losses.back(), 0.5 * gpu.losses.front());
    EXPECT_NEAR(gpu.losses.back(), host.losses.back(), 0.05 * host.losses.back());
  }
}

// The host run learns too (checked here so the GPU test's threshold is known to be
// reachable without a GPU).
TEST(TrainingHost, Learns) {
  for (const TrainCase& c : cases(Device::host())) {
    SCOPED_TRACE(case_name(c));
    const RunResult r = train(c, 30);
    EXPECT_LT(r.losses.back(), 0.5 * r.losses.front());
  }
}

}  // namespace
}  // namespace qmesh
