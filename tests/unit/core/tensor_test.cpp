#include "qmesh/tensor.h"

#include <gtest/gtest.h>

#include "expect_error.h"
#include "qmesh/config.h"
#include "qmesh/copy.h"
#include "qmesh/device.h"
#include "qmesh/quantized_tensor.h"

namespace qmesh {
namespace {

TEST(Tensor, HostAllocationIsAlignedAndSized) {
  Tensor t(DType::kBFloat16, Shape{3, 5});
  EXPECT_EQ(t.nbytes(), 30u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
  EXPECT_TRUE(t.device().is_host());
  EXPECT_EQ(t.view().shape, (Shape{3, 5}));
}

TEST(Tensor, NullDataWithNonEmptyShapeIsAnError) {
  EXPECT_QMESH_ERROR(TensorView(nullptr, DType::kFloat32, Shape{4}), "has null data");
}

TEST(Tensor, TypedAccessChecksDType) {
  Tensor t(DType::kFloat32, Shape{2});
  EXPECT_NO_THROW(t.data_as<float>());
  EXPECT_QMESH_ERROR(t.data_as<int32_t>(), "tensor of dtype fp32 accessed as int32");
}

TEST(Tensor, ArgumentChecksNameTheArgument) {
  Tensor t(DType::kFloat32, Shape{2, 2});
  EXPECT_QMESH_ERROR(check_dtype(t, DType::kBFloat16, "input x"),
                     "input x must have dtype bf16, got fp32");
  EXPECT_QMESH_ERROR(check_device(t, Device::cuda(0), "weight"),
                     "weight must be on cuda:0, got host");
  EXPECT_QMESH_ERROR(check_shape(t, Shape{4}, "bias"), "bias must have shape [4], got [2, 2]");
}

TEST(Tensor, CudaAllocationWithoutDeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_QMESH_ERROR(Tensor(DType::kFloat32, Shape{4}, Device::cuda(0)),
                     "device cuda:0 is not available");
}

TEST(Tensor, CopyChecksShapes) {
  Tensor a(DType::kFloat32, Shape{4}), b(DType::kFloat32, Shape{2, 2});
  for (int i = 0; i < 4; ++i) a.data_as<float>()[i] = float(i);
  EXPECT_QMESH_ERROR(copy_tensor(b, a), "copy destination must have shape [4], got [2, 2]");
  Tensor c(DType::kFloat32, Shape{4});
  copy_tensor(c, a);
  EXPECT_EQ(c.data_as<float>()[3], 3.0f);
}

TEST(QuantizedTensor, LayoutAndInitialScalars) {
  QuantizedTensor q(DType::kFloat8E4M3, Shape{4, 8}, Device::host(), /*columnwise=*/true);
  const QuantizedTensorView v = q.view();
  EXPECT_NO_THROW(v.validate("x"));
  EXPECT_EQ(v.data_t.shape, (Shape{8, 4}));
  EXPECT_EQ(*v.scale, 1.0f);
  EXPECT_EQ(*v.scale_inv, 1.0f);
  EXPECT_EQ(*v.amax, 0.0f);
  EXPECT_QMESH_ERROR(QuantizedTensor(DType::kBFloat16, Shape{2}, Device::host(), false),
                     "needs an FP8 dtype, got bf16");
}

TEST(QuantizedTensor, ValidateRejectsMismatchedColumnwise) {
  QuantizedTensor q(DType::kFloat8E4M3, Shape{4, 8}, Device::host(), false);
  Tensor wrong(DType::kFloat8E4M3, Shape{4, 8});
  QuantizedTensorView v = q.view();
  v.data_t = wrong;
  EXPECT_QMESH_ERROR(v.validate("weight"), "weight columnwise data must have shape [8, 4]");
}

TEST(Device, DiscoveryIsCleanWithoutAGpu) {
  const int n = cuda_device_count();
  EXPECT_GE(n, 0);
  EXPECT_EQ(Device::cuda(1).str(), "cuda:1");
  EXPECT_EQ(Device::host().str(), "host");
}

// Without a usable device (a build without CUDA, or a machine without a GPU) the guard is a
// clear Error, and its std::nothrow form (for cleanup paths) neither throws nor aborts.
TEST(Device, GuardWithoutADeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  if (QMESH_WITH_CUDA)
    EXPECT_THROW(DeviceGuard(0), Error);
  else
    EXPECT_QMESH_ERROR(DeviceGuard(0), "qmesh was built with QMESH_WITH_CUDA=OFF");
  EXPECT_NO_THROW(DeviceGuard(0, std::nothrow));
}

}  // namespace
}  // namespace qmesh
