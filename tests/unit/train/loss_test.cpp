// mse_loss on the host against the definition of the mean-squared error evaluated in float64.
#include "qmesh/train/loss.h"

#include <gtest/gtest.h>

#include "expect_error.h"
#include "qmesh/comm/local.h"
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

// The global loss on a dp 2 x tp 2 mesh of local ranks: with outputs replicated over tp (each
// tp rank of a dp group holds the same y), every dp group's elements count once; with outputs
// split over tp, every rank's count. Against the float64 mean over the distinct tensors.
TEST(MseLoss, TheMeshOverloadReturnsTheGlobalLoss) {
  const Shape shape{6, 5};
  for (LossOutputs outputs : {LossOutputs::kReplicatedOverTp, LossOutputs::kSplitOverTp}) {
    const bool split = outputs == LossOutputs::kSplitOverTp;
    // The tensors of (dp, tp) coordinates: distinct per dp, and per tp when split.
    auto seed = [&](int dp, int tp) { return uint32_t(10 + 2 * dp + (split ? tp : 0)); };
    double expected = 0;
    const int distinct = split ? 4 : 2;
    for (int dp = 0; dp < 2; ++dp)
      for (int tp = 0; tp < (split ? 2 : 1); ++tp) {
        const Tensor y = random_tensor(shape, seed(dp, tp)), t = random_tensor(shape, 99);
        for (int64_t i = 0; i < shape.numel(); ++i) {
          const double d = double(y.data_as<float>()[i]) - double(t.data_as<float>()[i]);
          expected += d * d / (double(distinct) * double(shape.numel()));
        }
      }
    run_local_ranks(4, [&](Communicator& world) {
      Mesh mesh(std::shared_ptr<Communicator>(&world, [](Communicator*) {}),
                {{"dp", 2}, {"tp", 2}});
      const Tensor y = random_tensor(shape, seed(mesh.coord("dp"), mesh.coord("tp")));
      const Tensor t = random_tensor(shape, 99);
      Tensor dy(DType::kFloat32, shape);
      const double loss = mse_loss(mesh, outputs, y, t, dy);
      EXPECT_NEAR(loss, expected, 1e-12 * expected) << split;
      const double d0 = double(y.data_as<float>()[0]) - double(t.data_as<float>()[0]);
      EXPECT_EQ(dy.data_as<float>()[0], float(2 * d0 / (double(distinct) * double(shape.numel()))));
    });
  }
}

}  // namespace
}  // namespace qmesh
