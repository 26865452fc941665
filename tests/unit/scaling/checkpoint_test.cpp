// Scaling-state checkpoints: bit-identical resume, and every kind of bad file rejected with a
// clear Error while the in-memory state stays as it was.
#include "qmesh/scaling/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "expect_error.h"
#include "qmesh/scaling/scaling_states.h"

namespace qmesh {
namespace {

namespace fs = std::filesystem;

const std::vector<OperandRole> kRoles = {OperandRole::kInput, OperandRole::kWeight,
                                         OperandRole::kGradOutput};

DelayedScaling recipe(int len) {
  DelayedScaling r;
  r.amax_history_len = len;
  r.margin = 1.0f;
  return r;
}

// Feeds `steps` steps of amaxes from rng into the state and updates it.
void run_steps(ScalingStates& s, std::mt19937& rng, int steps) {
  std::uniform_real_distribution<float> amax(0.0f, 100.0f);
  for (int k = 0; k < steps; ++k) {
    float* current = s.current_amax().data_as<float>();
    for (int i = 0; i < s.size(); ++i) current[i] = amax(rng);
    s.update();
  }
}

std::vector<uint8_t> snapshot(const ScalingStates& s) {
  std::vector<uint8_t> out;
  for (const TensorView& t : {s.amax_history(), s.scale(), s.scale_inv()}) {
    const auto* p = static_cast<const uint8_t*>(t.data);
    out.insert(out.end(), p, p + t.nbytes());
  }
  return out;
}

std::vector<char> read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void write_file(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           ("qmesh_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    path_ = (dir_ / "scaling.bin").string();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Saves a trained state; returns the file's bytes.
  std::vector<char> saved() {
    ScalingStates s(recipe(16), kRoles);
    std::mt19937 rng(1);
    run_steps(s, rng, 20);
    save_scaling_states(s, path_);
    return read_file(path_);
  }

  // load must fail with `message` and leave a trained state bit-identical.
  void expect_rejected(const std::string& message) {
    ScalingStates target(recipe(16), kRoles);
    std::mt19937 rng(2);
    run_steps(target, rng, 5);
    const auto before = snapshot(target);
    EXPECT_QMESH_ERROR(load_scaling_states(target, path_), message);
    EXPECT_EQ(snapshot(target), before) << "a failed load modified the state";
  }

  fs::path dir_;
  std::string path_;
};

TEST_F(CheckpointTest, ResumeReproducesBitIdenticalScales) {
  for (int len : {1, 16, 1024}) {
    ScalingStates original(recipe(len), kRoles);
    std::mt19937 rng(7);
    run_steps(original, rng, 40);
    save_scaling_states(original, path_);
    ScalingStates resumed(recipe(len), kRoles);
    load_scaling_states(resumed, path_);
    EXPECT_EQ(snapshot(resumed), snapshot(original));
    std::mt19937 rng_a(9), rng_b(9);
    run_steps(original, rng_a, 30);
    run_steps(resumed, rng_b, 30);
    EXPECT_EQ(snapshot(resumed), snapshot(original)) << "history " << len;
  }
}

TEST_F(CheckpointTest, SaveReplacesAtomicallyAndLeavesNoTemporaryFile) {
  saved();
  ScalingStates other(recipe(16), kRoles);
  save_scaling_states(other, path_);
  ScalingStates loaded(recipe(16), kRoles);
  std::mt19937 rng(3);
  run_steps(loaded, rng, 3);
  load_scaling_states(loaded, path_);
  EXPECT_EQ(snapshot(loaded), snapshot(other));
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    (void)entry;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST_F(CheckpointTest, TruncatedFilesAreRejected) {
  const auto bytes = saved();
  for (size_t keep : {size_t{0}, size_t{7}, size_t{27}, size_t{40}, bytes.size() - 1}) {
    write_file(path_, std::vector<char>(bytes.begin(), bytes.begin() + keep));
    expect_rejected(keep < 28 ? "not a qmesh scaling checkpoint" : "is truncated");
  }
}

TEST_F(CheckpointTest, TrailingBytesAreRejected) {
  auto bytes = saved();
  bytes.push_back(0);
  write_file(path_, bytes);
  expect_rejected("1 trailing bytes");
}

TEST_F(CheckpointTest, CorruptedFilesAreRejected) {
  const auto bytes = saved();
  for (size_t at : {size_t{29}, size_t{100}, bytes.size() / 2, bytes.size() - 1}) {
    auto bad = bytes;
    bad[at] = static_cast<char>(bad[at] ^ 0x10);
    write_file(path_, bad);
    expect_rejected("checksum mismatch");
  }
}

TEST_F(CheckpointTest, WrongMagicAndVersionAreRejected) {
  auto bytes = saved();
  auto bad_magic = bytes;
  bad_magic[0] = 'X';
  write_file(path_, bad_magic);
  expect_rejected("not a qmesh scaling checkpoint");
  bytes[8] = 2;
  write_file(path_, bytes);
  expect_rejected("format version 2 but this build reads version 1");
}

TEST_F(CheckpointTest, WrongShapesAndRolesAreRejected) {
  saved();
  const auto before_len = [&](int len, std::vector<OperandRole> roles, const std::string& msg) {
    ScalingStates target(recipe(len), std::move(roles));
    const auto before = snapshot(target);
    EXPECT_QMESH_ERROR(load_scaling_states(target, path_), msg);
    EXPECT_EQ(snapshot(target), before);
  };
  before_len(32, kRoles, "holds 3 operands x history 16 but the state has 3 operands x history 32");
  before_len(16, {OperandRole::kInput}, "holds 3 operands x history 16 but the state has 1");
  before_len(16, {OperandRole::kInput, OperandRole::kGradOutput, OperandRole::kGradOutput},
             "operand 1 was saved with role 1");
}

TEST_F(CheckpointTest, MissingFileAndUnwritableDirectoryAreErrors) {
  expect_rejected("cannot open scaling checkpoint");
  ScalingStates s(recipe(4), kRoles);
  EXPECT_QMESH_ERROR(save_scaling_states(s, (dir_ / "no_such_dir" / "x.bin").string()),
                     "cannot create scaling checkpoint");
}

TEST_F(CheckpointTest, OtherRecipeParametersLoadWithAWarning) {
  saved();
  DelayedScaling other = recipe(16);
  other.margin = 2.0f;
  other.amax_compute_algo = AmaxComputeAlgo::kMostRecent;
  ScalingStates s(other, kRoles);
  load_scaling_states(s, path_);
  EXPECT_NE(s.scale().data_as<float>()[0], 1.0f);
}

}  // namespace
}  // namespace qmesh
