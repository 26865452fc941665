#include "qmesh/tensor_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <vector>

#include "core/atomic_file.h"
#include "expect_error.h"
#include "qmesh/config.h"

namespace qmesh {
namespace {

class TensorFile : public testing::Test {
 protected:
  void SetUp() override {
    if (!QMESH_WITH_ZLIB) GTEST_SKIP() << "built without zlib: checkpoints unavailable";
    dir_ = std::filesystem::temp_directory_path() /
           ("qmesh_tensor_file_" + std::to_string(::getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "t.qmt").string();
    for (int i = 0; i < 6; ++i) a_.data_as<float>()[i] = 0.5f * float(i) - 1.0f;
    for (int i = 0; i < 3; ++i) b_.data_as<int32_t>()[i] = 100 + i;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<NamedTensor> model(const Tensor& a, const Tensor& b) {
    return {{"layer.weight", a}, {"optimizer.step", b}};
  }
  std::vector<uint8_t> bytes() {
    std::ifstream f(path_, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  }
  void write(const std::vector<uint8_t>& b) {
    std::ofstream f(path_, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
  // Loading must fail with `message` and leave the destination untouched.
  void expect_rejected(const char* message) {
    Tensor a(DType::kFloat32, Shape{2, 3}), b(DType::kInt32, Shape{3});
    std::fill_n(a.data_as<float>(), 6, 7.0f);
    EXPECT_QMESH_ERROR(load_tensors(path_, model(a, b)), message);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(a.data_as<float>()[i], 7.0f);
  }

  std::filesystem::path dir_;
  std::string path_;
  Tensor a_{DType::kFloat32, Shape{2, 3}}, b_{DType::kInt32, Shape{3}};
};

TEST_F(TensorFile, RoundTripIsExact) {
  save_tensors(path_, model(a_, b_));
  Tensor a(DType::kFloat32, Shape{2, 3}), b(DType::kInt32, Shape{3});
  load_tensors(path_, model(a, b));
  EXPECT_EQ(std::memcmp(a.data(), a_.data(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(b.data(), b_.data(), b.nbytes()), 0);
  EXPECT_FALSE(std::filesystem::exists(path_ + ".tmp." + std::to_string(::getpid())));
}

TEST_F(TensorFile, MissingFile) { expect_rejected("cannot open tensor file"); }

TEST_F(TensorFile, TruncatedFile) {
  save_tensors(path_, model(a_, b_));
  auto b = bytes();
  b.resize(b.size() - 9);
  write(b);
  expect_rejected("corrupted");
}

TEST_F(TensorFile, FlippedBitIsACorruption) {
  save_tensors(path_, model(a_, b_));
  auto b = bytes();
  b[b.size() / 2] ^= 0x10;
  write(b);
  expect_rejected("checksum mismatch");
}

TEST_F(TensorFile, WrongVersion) {
  save_tensors(path_, model(a_, b_));
  auto b = bytes();
  b[8] = 99;
  write(b);
  expect_rejected("has format version 99");
}

TEST_F(TensorFile, NotATensorFile) {
  write({'h', 'e', 'l', 'l', 'o'});
  expect_rejected("is not a qmesh tensor file");
}

TEST_F(TensorFile, WrongShapeOrNames) {
  Tensor wide(DType::kFloat32, Shape{3, 2});
  save_tensors(path_, model(wide, b_));
  expect_rejected("does not match the model's fp32 [2, 3]");
  save_tensors(path_, {{"other", a_}, {"optimizer.step", b_}});
  expect_rejected("holds 'other', which this model does not have");
  save_tensors(path_, {{"layer.weight", a_}});
  expect_rejected("holds 1 tensors, expected 2");
}

TEST_F(TensorFile, ReadTensorsGivesEveryTensorWithItsDtypeAndShape) {
  save_tensors(path_, model(a_, b_));
  const std::map<std::string, Tensor> got = read_tensors(path_);
  ASSERT_EQ(got.size(), 2u);
  const Tensor& a = got.at("layer.weight");
  const Tensor& b = got.at("optimizer.step");
  EXPECT_EQ(a.dtype(), DType::kFloat32);
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  EXPECT_EQ(b.dtype(), DType::kInt32);
  EXPECT_EQ(b.shape(), Shape{3});
  EXPECT_EQ(std::memcmp(a.data(), a_.data(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(b.data(), b_.data(), b.nbytes()), 0);
  auto flipped = bytes();
  flipped[flipped.size() / 2] ^= 0x10;
  write(flipped);
  EXPECT_QMESH_ERROR(read_tensors(path_), "checksum mismatch");
}

// copy_tensors takes the tensors it is given out of a file read whole, which may hold more;
// a missing or mismatched one is an Error before anything is written.
TEST_F(TensorFile, CopyTensorsTakesWhatItIsGivenFromAFileReadWhole) {
  save_tensors(path_, {{"layer.weight", a_}, {"optimizer.step", b_}, {"extra", b_}});
  const std::map<std::string, Tensor> file = read_tensors(path_);
  Tensor a(DType::kFloat32, Shape{2, 3}), b(DType::kInt32, Shape{3});
  copy_tensors(file, model(a, b), path_);
  EXPECT_EQ(std::memcmp(a.data(), a_.data(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(b.data(), b_.data(), b.nbytes()), 0);
  std::fill_n(a.data_as<float>(), 6, 7.0f);
  Tensor other(DType::kInt32, Shape{4});
  EXPECT_QMESH_ERROR(copy_tensors(file, {{"layer.weight", a}, {"optimizer.step", other}}, path_),
                     "'optimizer.step' in " + path_ + " does not match the model's int32 [4]");
  EXPECT_QMESH_ERROR(copy_tensors(file, {{"layer.weight", a}, {"missing", b}}, path_),
                     "lacks 'missing'");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(a.data_as<float>()[i], 7.0f) << "written before the Error";
}

// A header whose sizes run past the end of the file (with a valid checksum) is an error for
// both readers, never a read out of bounds.
TEST_F(TensorFile, SizesPastTheEndAreAnError) {
  save_tensors(path_, model(a_, b_));
  auto b = bytes();
  // The first dimension of the first tensor: after the magic, version, count, name length,
  // name, dtype and rank.
  const size_t dim0 = 8 + 4 + 4 + 4 + std::strlen("layer.weight") + 1 + 1;
  const int64_t huge = int64_t(1) << 40;
  std::memcpy(b.data() + dim0, &huge, sizeof(huge));
  const uint32_t crc = crc32_of(b.data(), b.size() - 4);
  std::memcpy(b.data() + b.size() - 4, &crc, sizeof(crc));
  write(b);
  EXPECT_QMESH_ERROR(read_tensors(path_), "runs past the end");
  expect_rejected("runs past the end");
}

TEST_F(TensorFile, UnwritableDirectoryIsAClearError) {
  EXPECT_QMESH_ERROR(save_tensors((dir_ / "missing" / "t.qmt").string(), model(a_, b_)),
                     "check that the directory exists and is writable");
}

}  // namespace
}  // namespace qmesh
