// Checkpoints under mpirun -np 2 (a LayerNormMLP block, tp 2, FP8 delayed scaling): loading is
// collective, so a file missing or corrupted on one rank fails on every rank with the same
// message and leaves every rank's state as it was (before, the other rank resumed and the job
// hung in its next collective); a chosen step loads; the recipe and the FP8 scaling state are
// part of the content and checked at load.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "qmesh/comm/mesh.h"
#include "qmesh/comm/mpi.h"
#include "qmesh/error.h"
#include "qmesh/layers/layer_norm_mlp.h"
#include "qmesh/scaling/checkpoint.h"
#include "qmesh/train/checkpoint.h"
#include "qmesh/train/optimizer.h"

namespace qmesh {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::shared_ptr<Communicator> world() {
  static std::shared_ptr<Communicator> w = make_mpi_world();
  return w;
}

constexpr int64_t kTokens = 8, kHidden = 16, kFfn = 32;

// A one-block model on a tp 2 mesh: its parameters are drawn from `seed`, and each step trains
// it on data of that step.
struct Trainer {
  Trainer(Recipe recipe, uint64_t seed)
      : mesh(world(), {{"dp", 1}, {"tp", 2}}),
        ctx(mesh, recipe),
        block("block", kHidden, kFfn, {}, ctx, seed),
        opt(make_sgd(block.parameters(), {0.05f, 0.0f, 0.0f})),
        content(training_checkpoint(ctx, block.parameters(), *opt)) {}

  void step(int s) {
    Tensor x(DType::kFloat32, Shape{kTokens, kHidden}), dy(x.dtype(), x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) {
      x.data_as<float>()[i] = float((i * 7 + s * 3) % 11) / 5.0f - 1.0f;
      dy.data_as<float>()[i] = float((i * 5 + s) % 13) / 50.0f - 0.1f;
    }
    block.forward(x);
    block.backward(dy);
    ctx.end_step();
    opt->step();
  }

  // Every parameter's and scaling tensor's bytes, to compare states.
  std::vector<std::vector<char>> state() {
    std::vector<std::vector<char>> out;
    auto add = [&](const Tensor& t) {
      const char* b = static_cast<const char*>(t.data());
      out.emplace_back(b, b + t.nbytes());
    };
    for (const Parameter* p : block.parameters()) add(p->value);
    if (ctx.recipe() == Recipe::kFp8Delayed)
      for (const auto& entry : scaling_tensors(ctx.scaling())) add(entry.second);
    return out;
  }

  Mesh mesh;
  LayerContext ctx;
  LayerNormMLP block;
  std::unique_ptr<Optimizer> opt;
  CheckpointContent content;
};

class CheckpointMpi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(world()->size(), 2) << "run with mpirun -np 2";
    Tensor pid(DType::kInt32, Shape{1});
    *pid.data_as<int32_t>() = ::getpid();
    world()->broadcast(pid, 0);  // rank 0's names the directory every rank uses
    dir_ = (fs::temp_directory_path() /
            ("qmesh_ckpt_mpi_" + std::to_string(*pid.data_as<int32_t>()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name()))
               .string();
  }
  void TearDown() override {
    world()->barrier();
    if (world()->rank() == 0) fs::remove_all(dir_);
  }

  // Saves steps 1 and 2 of a delayed-scaling run; returns its state after step 2.
  std::vector<std::vector<char>> save_two_steps() {
    Trainer run(Recipe::kFp8Delayed, 1);
    run.step(1);
    save_checkpoint(dir_, 1, run.content, *world());
    run.step(2);
    save_checkpoint(dir_, 2, run.content, *world());
    return run.state();
  }

  std::string rank_file(int step, int rank) const {
    return dir_ + "/step-" + std::to_string(step) + "/rank-" + std::to_string(rank) + ".tensors";
  }

  // Loads into `run` and expects an Error on every rank with `text` in its message, and the
  // run's state untouched.
  void expect_fails_everywhere(Trainer& run, const std::string& text,
                               std::optional<int> step = {}) {
    const auto before = run.state();
    try {
      load_checkpoint(dir_, run.content, *world(), step);
      ADD_FAILURE() << "rank " << world()->rank() << ": the load succeeded";
    } catch (const Error& e) {
      EXPECT_THAT(e.message(), HasSubstr(text)) << "rank " << world()->rank();
    }
    EXPECT_EQ(run.state(), before) << "rank " << world()->rank() << " changed its state";
    world()->barrier();  // the ranks are still in step
  }

  std::string dir_;
};

TEST_F(CheckpointMpi, ResumesBitwiseWithTheScalingState) {
  const auto saved = save_two_steps();
  Trainer fresh(Recipe::kFp8Delayed, 99);
  fresh.step(1);  // a scaling state of its own, to be overwritten
  EXPECT_EQ(load_checkpoint(dir_, fresh.content, *world()), 2);
  EXPECT_EQ(fresh.state(), saved);
}

TEST_F(CheckpointMpi, AChosenStepLoads) {
  Trainer run(Recipe::kFp8Delayed, 1);
  run.step(1);
  save_checkpoint(dir_, 1, run.content, *world());
  const auto at_one = run.state();
  run.step(2);
  save_checkpoint(dir_, 2, run.content, *world());
  Trainer fresh(Recipe::kFp8Delayed, 99);
  fresh.step(1);
  EXPECT_EQ(load_checkpoint(dir_, fresh.content, *world(), 1), 1);
  EXPECT_EQ(fresh.state(), at_one);
  expect_fails_everywhere(fresh, "no checkpoint of step 7", 7);
  expect_fails_everywhere(fresh, "the checkpoints there: step-1 step-2", 7);
}

TEST_F(CheckpointMpi, AFileMissingOnOneRankFailsOnEveryRank) {
  save_two_steps();
  if (world()->rank() == 1) fs::remove(rank_file(2, 1));
  world()->barrier();
  Trainer fresh(Recipe::kFp8Delayed, 99);
  fresh.step(1);
  expect_fails_everywhere(fresh, "failed on rank 1 of 2 (no rank changed its state)");
  expect_fails_everywhere(fresh, rank_file(2, 1));
}

TEST_F(CheckpointMpi, AFileCorruptedOnOneRankFailsOnEveryRank) {
  save_two_steps();
  if (world()->rank() == 1) {
    std::fstream f(rank_file(2, 1), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(200);
    f.put('\x5a');
  }
  world()->barrier();
  Trainer fresh(Recipe::kFp8Delayed, 99);
  fresh.step(1);
  expect_fails_everywhere(fresh, "failed on rank 1 of 2");
  expect_fails_everywhere(fresh, "checksum");
}

// A checkpoint without a layout is not resharded: one written by more ranks is an error on
// every rank (before, each rank loaded its own file and the others' were silently dropped), and
// a save by fewer ranks removes the files an earlier, larger save left in its step.
TEST_F(CheckpointMpi, ACheckpointOfMoreRanksWithoutALayoutIsAnError) {
  float v[2] = {float(world()->rank()), 1.0f};
  CheckpointContent content;
  content.tensors = {{"v", TensorView(v, DType::kFloat32, Shape{2})}};
  save_checkpoint(dir_, 1, content, *world());
  if (world()->rank() == 0) fs::copy_file(rank_file(1, 1), rank_file(1, 2));  // as rank 2's
  world()->barrier();
  try {
    load_checkpoint(dir_, content, *world());
    ADD_FAILURE() << "rank " << world()->rank() << ": the load succeeded";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), HasSubstr("written by more ranks than this world's 2"));
  }
  save_checkpoint(dir_, 1, content, *world());
  EXPECT_FALSE(fs::exists(rank_file(1, 2)));
  EXPECT_EQ(load_checkpoint(dir_, content, *world()), 1);
}

// A rank that cannot write its file (a directory is in the way) stops every rank's save with
// the same message; `latest` still names the previous checkpoint, which loads.
TEST_F(CheckpointMpi, ASaveThatFailsOnOneRankFailsOnEveryRank) {
  Trainer run(Recipe::kFp8Delayed, 1);
  run.step(1);
  save_checkpoint(dir_, 1, run.content, *world());
  if (world()->rank() == 1) fs::create_directories(rank_file(2, 1) + "/in_the_way");
  world()->barrier();
  run.step(2);
  try {
    save_checkpoint(dir_, 2, run.content, *world());
    ADD_FAILURE() << "rank " << world()->rank() << ": the save succeeded";
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), HasSubstr("saving the checkpoint of step 2 in " + dir_ +
                                       " failed on rank 1 of 2 (no `latest` names this step"))
        << "rank " << world()->rank();
  }
  Trainer fresh(Recipe::kFp8Delayed, 99);
  EXPECT_EQ(load_checkpoint(dir_, fresh.content, *world()), 1);
}

// A save interrupted as by a crash (each rank's file, the layout and `latest` half-written to
// their temporary files, never renamed) leaves the previous checkpoint the one that loads, and
// the next save goes through over the stale temporary files.
TEST_F(CheckpointMpi, AnInterruptedSaveLeavesThePreviousCheckpointIntact) {
  Trainer run(Recipe::kFp8Delayed, 1);
  run.step(1);
  save_checkpoint(dir_, 1, run.content, *world());
  const auto at_one = run.state();
  const fs::path step2 = dir_ + "/step-2";
  if (world()->rank() == 0) {
    fs::create_directories(step2);
    for (const fs::path& partial :
         {step2 / "rank-0.tensors.tmp.1", step2 / "rank-1.tensors.tmp.1",
          step2 / "layout.tensors.tmp.1", fs::path(dir_) / "latest.tmp.1"})
      std::ofstream(partial, std::ios::binary) << "QMTENSOR";  // a file's first bytes only
  }
  world()->barrier();
  Trainer fresh(Recipe::kFp8Delayed, 99);
  fresh.step(1);
  EXPECT_EQ(load_checkpoint(dir_, fresh.content, *world()), 1);
  EXPECT_EQ(fresh.state(), at_one);
  run.step(2);
  save_checkpoint(dir_, 2, run.content, *world());
  EXPECT_EQ(load_checkpoint(dir_, fresh.content, *world()), 2);
  EXPECT_EQ(fresh.state(), run.state());
}

// The layout is a tensor file (layout.tensors); a checkpoint written before that, with the
// layout as the text file `layout` ("dp fsdp tp"), is read through it.
TEST_F(CheckpointMpi, TheOlderTextLayoutIsRead) {
  save_two_steps();
  const fs::path step2 = dir_ + "/step-2";
  if (world()->rank() == 0) {
    EXPECT_TRUE(fs::exists(step2 / "layout.tensors"));
    fs::remove(step2 / "layout.tensors");
    std::ofstream(step2 / "layout") << "1 1 1\n";  // a tp 1 run's
  }
  world()->barrier();
  Trainer fresh(Recipe::kFp8Delayed, 99);
  expect_fails_everywhere(fresh, "was written with dp 1 x fsdp 1 x tp 1; resume it with tp 1");
  if (world()->rank() == 0) std::ofstream(step2 / "layout") << "1 1 2\n";  // this run's
  world()->barrier();
  EXPECT_EQ(load_checkpoint(dir_, fresh.content, *world()), 2);
}

TEST_F(CheckpointMpi, NoCheckpointFailsOnEveryRankWithoutNamingAProgramsFlags) {
  Trainer fresh(Recipe::kFp8Delayed, 99);
  fresh.step(1);
  expect_fails_everywhere(fresh,
                          "no checkpoint to resume from: " + dir_ + "/latest does not exist");
  try {
    load_checkpoint(dir_, fresh.content, *world());
  } catch (const Error& e) {
    EXPECT_THAT(e.message(), ::testing::Not(HasSubstr("--")));
  }
}

TEST_F(CheckpointMpi, AnFp8CheckpointUnderAnotherRecipeIsAnError) {
  save_two_steps();
  Trainer bf16(Recipe::kBf16, 99);
  expect_fails_everywhere(bf16,
                          "saved under the 'delayed' recipe, but this LayerContext's "
                          "recipe is 'bf16'");
  Trainer current(Recipe::kFp8Current, 99);
  expect_fails_everywhere(current, "resume with the recipe that saved it");
}

TEST_F(CheckpointMpi, AContentWithoutTheContextCannotDropTheFp8State) {
  save_two_steps();
  Trainer fresh(Recipe::kFp8Delayed, 99);
  fresh.step(1);
  CheckpointContent partial = fresh.content;
  partial.context = nullptr;
  const auto before = fresh.state();
  EXPECT_THROW(
      {
        try {
          load_checkpoint(dir_, partial, *world());
        } catch (const Error& e) {
          EXPECT_THAT(e.message(), HasSubstr("pass the LayerContext"));
          throw;
        }
      },
      Error);
  EXPECT_EQ(fresh.state(), before);
}

TEST_F(CheckpointMpi, ACheckpointWithoutTheFp8StateIsAnErrorUnderDelayedScaling) {
  {
    Trainer run(Recipe::kFp8Delayed, 1);
    run.step(1);
    CheckpointContent partial = run.content;
    partial.context = nullptr;  // saved as a content without its context would be
    save_checkpoint(dir_, 1, partial, *world());
  }
  Trainer fresh(Recipe::kFp8Delayed, 99);
  fresh.step(1);
  expect_fails_everywhere(fresh,
                          "holds no FP8 scaling state, but this LayerContext uses "
                          "delayed scaling");
}

}  // namespace
}  // namespace qmesh
