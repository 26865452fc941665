// mse_loss on the host against the definition of the mean-squared error evaluated in float64.
#include "qmesh/train/loss.h"

#include <gtest/gtest.h>

#include "expect_error.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using test::random_tensor;

TEST(MseLoss, MatchesTheFloat64Definition) {
  const Shape shape{37, 11};
  const Tensor y = random_tensor(shape, 1), t = random_tensor(shape, 2);
  Tensor dy(DType::kFloat32, shape), sum(DType::kFloat64, Shape{1});
  const double global_count = 4.0 * double(shape.numel());  // this rank holds a quarter
  mse_loss(y, t, global_count, dy, sum);
  double expected = 0;
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const double d = double(y.data_as<float>()[i]) - double(t.data_as<float>()[i]);
    expected += d * d;
    // d/dy of sum(d^2) / global_count, rounded once to fp32.
    ASSERT_EQ(dy.data_as<float>()[i], float(2 * d / global_count)) << "element " << i;
  }
  EXPECT_NEAR(*sum.data_as<double>(), expected, 1e-12 * expected);
}

TEST(MseLoss, PerfectPredictionHasZeroLossAndGradient) {
  const Tensor y = random_tensor(Shape{5, 3}, 3);
  Tensor dy(DType::kFloat32, y.shape()), sum(DType::kFloat64, Shape{1});
  mse_loss(y, y, 15, dy, sum);
  EXPECT_EQ(*sum.data_as<double>(), 0.0);
  for (int64_t i = 0; i < y.numel(); ++i) EXPECT_EQ(dy.data_as<float>()[i], 0.0f);
}

TEST(MseLoss, BadArgumentsAreErrors) {
  const Tensor y = random_tensor(Shape{4, 3}, 4);
  Tensor dy(DType::kFloat32, y.shape()), sum(DType::kFloat64, Shape{1});
  EXPECT_QMESH_ERROR(mse_loss(y, Tensor(DType::kFloat32, Shape{3, 4}), 12, dy, sum),
                     "mse_loss target");
  EXPECT_QMESH_ERROR(mse_loss(y, y, 12, Tensor(DType::kBFloat16, y.shape()), sum), "mse_loss dy");
  EXPECT_QMESH_ERROR(mse_loss(y, y, 12, dy, Tensor(DType::kFloat32, Shape{1})), "sum_sq");
  EXPECT_QMESH_ERROR(mse_loss(y, y, 12, dy, Tensor(DType::kFloat64, Shape{2})), "sum_sq");
  EXPECT_QMESH_ERROR(mse_loss(y, y, 11, dy, sum), "global_count");
  // A view claiming to be on a GPU (never dereferenced: the device check comes first).
  const TensorView on_gpu(y.data(), DType::kFloat32, y.shape(), Device::cuda(0));
  EXPECT_QMESH_ERROR(mse_loss(y, on_gpu, 12, dy, sum), "mse_loss target");
}

}  // namespace
}  // namespace qmesh
