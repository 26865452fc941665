// mse_loss on CUDA against the host op on the same inputs (dy bit for bit, the float64 sum to
// rounding) and against itself (deterministic sum); OwnedStream on a GPU. Skipped without a
// GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "qmesh/copy.h"
#include "qmesh/owned_stream.h"
#include "qmesh/train/loss.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

const Device kGpu = Device::cuda(0);

class LossGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

double read_scalar(const Tensor& device_scalar) {
  return *clone(device_scalar, Device::host()).data_as<double>();
}

TEST_F(LossGpu, MatchesTheHostOpAndIsDeterministic) {
  // More elements than one pass of the fixed grid covers, and a ragged tail.
  const Shape shape{1031, 1023};
  const Tensor y = test::random_tensor(shape, 7), t = test::random_tensor(shape, 8);
  const double global_count = 2.0 * double(shape.numel());
  Tensor dy(DType::kFloat32, shape), sum(DType::kFloat64, Shape{1});
  mse_loss(y, t, global_count, dy, sum);

  const OwnedStream stream(kGpu);
  const Tensor y_gpu = clone(y, kGpu), t_gpu = clone(t, kGpu);
  Tensor dy_gpu(DType::kFloat32, shape, kGpu), sum_gpu(DType::kFloat64, Shape{1}, kGpu);
  mse_loss(y_gpu, t_gpu, global_count, dy_gpu, sum_gpu, stream.get());
  synchronize(kGpu, stream.get());
  const Tensor dy_back = clone(dy_gpu, Device::host());
  EXPECT_EQ(std::memcmp(dy_back.data(), dy.data(), dy.nbytes()), 0) << "dy differs from the host";
  const double first = read_scalar(sum_gpu), host = *sum.data_as<double>();
  EXPECT_NEAR(first, host, 1e-12 * host);

  mse_loss(y_gpu, t_gpu, global_count, dy_gpu, sum_gpu, stream.get());
  synchronize(kGpu, stream.get());
  EXPECT_EQ(read_scalar(sum_gpu), first) << "two calls on the same input summed differently";
}

TEST_F(LossGpu, OwnedStreamOrdersWorkAndMoves) {
  OwnedStream a(kGpu);
  EXPECT_NE(a.get().handle, nullptr);
  EXPECT_EQ(a.device(), kGpu);
  OwnedStream b = std::move(a);
  EXPECT_EQ(a.get().handle, nullptr);  // NOLINT(bugprone-use-after-move): moved-from is empty
  const Tensor y = test::random_tensor(Shape{64, 64}, 9);
  const Tensor y_gpu = clone(y, kGpu);
  Tensor dy(DType::kFloat32, y.shape(), kGpu), sum(DType::kFloat64, Shape{1}, kGpu);
  mse_loss(y_gpu, y_gpu, double(y.numel()), dy, sum, b.get());
  synchronize(kGpu, b.get());
  EXPECT_EQ(read_scalar(sum), 0.0);
}

}  // namespace
}  // namespace qmesh
