// Scaling-state checkpoints (named tensors of a tensor file): bit-identical resume, and every
// kind of bad file rejected with a clear Error while the in-memory state stays as it was.
#include "qmesh/scaling/checkpoint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <vector>

#include "expect_error.h"
#include "qmesh/scaling/scaling_states.h"
#include "qmesh/tensor_file.h"

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

// CRC-32 (IEEE 802.3, bitwise), the tensor file's checksum: to forge files whose checksum is
// right, so that the checks behind it are reached.
uint32_t crc32(const char* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= uint8_t(p[i]);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// `body` (a file without its checksum) with its checksum appended.
std::vector<char> with_crc(std::vector<char> body) {
  const uint32_t crc = crc32(body.data(), body.size());
  const auto* p = reinterpret_cast<const char*>(&crc);
  body.insert(body.end(), p, p + 4);
  return body;
}

// Saves named tensors (views of `tensors`) as a tensor file.
void save_map(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  std::vector<NamedTensor> named;
  for (const auto& [name, t] : tensors) named.push_back({name, t});
  save_tensors(path, named);
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
  // The magic, version and count take 16 bytes, the checksum 4.
  for (size_t keep : {size_t{0}, size_t{7}, size_t{19}, size_t{40}, bytes.size() - 1}) {
    write_file(path_, std::vector<char>(bytes.begin(), bytes.begin() + keep));
    expect_rejected(keep < 20 ? "not a qmesh tensor file" : "checksum mismatch");
    // The same cut with a checksum that matches it: the parser finds the truncation.
    if (keep >= 20) {
      write_file(path_, with_crc(std::vector<char>(bytes.begin(), bytes.begin() + keep - 4)));
      expect_rejected("truncated or corrupted");
    }
  }
}

TEST_F(CheckpointTest, TrailingBytesAreRejected) {
  const auto bytes = saved();
  ASSERT_GT(bytes.size(), size_t{4});
  std::vector<char> body(bytes.begin(), bytes.end() - 4);  // without the checksum
  body.push_back(0);
  write_file(path_, with_crc(body));
  expect_rejected("1 unexpected trailing bytes");
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
  expect_rejected("not a qmesh tensor file");
  bytes[8] = 2;
  write_file(path_, bytes);
  expect_rejected("has format version 2; this build reads version 1");
  // The separate scaling-checkpoint format of earlier versions: magic, version 1, n, L, ...
  std::vector<char> old = {'Q', 'M', 'S', 'C', 'A', 'L', 'E', '\0', 1, 0, 0, 0};
  old.resize(103, 0);
  write_file(path_, with_crc(old));
  expect_rejected("separate format version 1 (\"QMSCALE\")");
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
  expect_rejected("cannot open tensor file");
  ScalingStates s(recipe(4), kRoles);
  EXPECT_QMESH_ERROR(save_scaling_states(s, (dir_ / "no_such_dir" / "x.bin").string()),
                     "cannot create tensor file");
}

// A train checkpoint's rank file: the scaling state next to other tensors, which
// load_scaling_states leaves alone; read_tensors verifies the file without knowing shapes.
TEST_F(CheckpointTest, StateNextToOtherTensorsLoads) {
  ScalingStates original(recipe(16), kRoles);
  std::mt19937 rng(5);
  run_steps(original, rng, 20);
  std::map<std::string, Tensor> tensors = scaling_tensors(original);
  Tensor weight(DType::kFloat32, Shape{2, 3});
  std::fill_n(weight.data_as<float>(), 6, 0.5f);
  tensors.emplace("layer.weight", std::move(weight));
  save_map(path_, tensors);
  EXPECT_EQ(read_tensors(path_).size(), 6u);
  ScalingStates resumed(recipe(16), kRoles);
  load_scaling_states(resumed, path_);
  EXPECT_EQ(snapshot(resumed), snapshot(original));
  // The saved scales are the logical values, one per operand.
  const Tensor& scale = tensors.at("scaling.scale");
  ASSERT_EQ(scale.shape(), Shape{3});
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(scale.data_as<float>()[i],
              original.scale().data_as<float>()[i * QuantizedTensor::kScalarSlot]);
}

// Files whose checksum is right but whose scaling tensors are missing or malformed.
TEST_F(CheckpointTest, MissingOrMalformedTensorsAreRejected) {
  ScalingStates s(recipe(16), kRoles);
  auto with = [&](const std::string& name, Tensor t) {
    std::map<std::string, Tensor> tensors = scaling_tensors(s);
    tensors.erase(name);
    if (t.data() != nullptr) tensors.emplace(name, std::move(t));
    save_map(path_, tensors);
  };
  with("scaling.roles", Tensor());
  expect_rejected("holds no FP8 delayed-scaling state ('scaling.roles' missing)");
  with("scaling.scale", Tensor(DType::kFloat32, Shape{4}));
  expect_rejected("'scaling.scale' in " + path_ + " does not hold one value per operand");
  with("scaling.amax_history", Tensor(DType::kFloat32, Shape{16, 2}));
  expect_rejected("does not hold one column per operand");
  with("scaling.scale_inv", Tensor(DType::kInt32, Shape{3}));
  expect_rejected("is int32 [3], expected fp32 of rank 1");
  with("scaling.recipe", Tensor(DType::kFloat32, Shape{2}));
  expect_rejected("does not hold 3 values");
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
