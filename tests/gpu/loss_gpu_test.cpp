// mse_loss on CUDA against the definition evaluated in float64 by the test (dy bit for bit,
// the float64 sum to rounding) and against itself (deterministic sum); bad inputs that only a
// GPU can give; OwnedStream on a GPU. Skipped without a GPU.
#include <gtest/gtest.h>

#include "expect_error.h"
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

TEST_F(LossGpu, MatchesTheFloat64DefinitionAndIsDeterministic) {
  // More elements than one pass of the fixed grid covers, and a ragged tail.
  const Shape shape{1031, 1023};
  const Tensor y = test::random_tensor(shape, 7), t = test::random_tensor(shape, 8);
  const double global_count = 2.0 * double(shape.numel());

  const OwnedStream stream(kGpu);
  const Tensor y_gpu = clone(y, kGpu), t_gpu = clone(t, kGpu);
  Tensor dy_gpu(DType::kFloat32, shape, kGpu), sum_gpu(DType::kFloat64, Shape{1}, kGpu);
  mse_loss(y_gpu, t_gpu, global_count, dy_gpu, sum_gpu, stream.get());
  synchronize(kGpu, stream.get());
  const Tensor dy = clone(dy_gpu, Device::host());
  double expected = 0;
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const double d = double(y.data_as<float>()[i]) - double(t.data_as<float>()[i]);
    expected += d * d;
    // d/dy of sum(d^2) / global_count, rounded once to fp32: what the host op writes too.
    ASSERT_EQ(dy.data_as<float>()[i], float(2 * d / global_count)) << "element " << i;
  }
  // Sums of ~1e6 positive terms in another order: a few 1e-14 apart, relatively.
  const double first = read_scalar(sum_gpu);
  EXPECT_NEAR(first, expected, 1e-12 * expected);

  mse_loss(y_gpu, t_gpu, global_count, dy_gpu, sum_gpu, stream.get());
  synchronize(kGpu, stream.get());
  EXPECT_EQ(read_scalar(sum_gpu), first) << "two calls on the same input summed differently";
}

// Tensors on the host or another device next to a GPU output: a clear Error before any
// kernel could read a host pointer.
TEST_F(LossGpu, MixedDevicesAreErrors) {
  const Tensor y = clone(test::random_tensor(Shape{8, 4}, 10), kGpu);
  const Tensor t_host = test::random_tensor(y.shape(), 11);
  Tensor dy(DType::kFloat32, y.shape(), kGpu), sum(DType::kFloat64, Shape{1}, kGpu);
  Tensor dy_host(DType::kFloat32, y.shape()), sum_host(DType::kFloat64, Shape{1});
  EXPECT_QMESH_ERROR(mse_loss(y, t_host, 32, dy, sum), "mse_loss target");
  EXPECT_QMESH_ERROR(mse_loss(y, y, 32, dy_host, sum), "mse_loss dy");
  EXPECT_QMESH_ERROR(mse_loss(y, y, 32, dy, sum_host), "mse_loss sum_sq");
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
