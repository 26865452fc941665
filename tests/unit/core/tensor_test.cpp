#include "qmesh/tensor.h"

#include <gtest/gtest.h>

#include <vector>

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

TEST(TensorView, RowsAreViewsOfTheSameMemory) {
  Tensor t(DType::kBFloat16, Shape{2, 3, 4});  // 6 rows of 4
  const TensorView r = t.view().rows(2, 5);
  EXPECT_EQ(r.shape, (Shape{3, 4}));
  EXPECT_EQ(r.dtype, DType::kBFloat16);
  EXPECT_EQ(r.device, t.device());
  EXPECT_EQ(static_cast<char*>(r.data), static_cast<char*>(t.data()) + 2 * 4 * 2);
  EXPECT_EQ(t.view().rows(0, 6).shape, (Shape{6, 4}));
  Tensor vec(DType::kFloat32, Shape{5});  // one row
  EXPECT_EQ(vec.view().rows(0, 1).shape, (Shape{1, 5}));
}

TEST(TensorView, SlicesAreViewsOfTheSameMemory) {
  Tensor t(DType::kFloat32, Shape{4, 6});
  const TensorView s = t.view().slice(5, Shape{2, 9});
  EXPECT_EQ(s.shape, (Shape{2, 9}));
  EXPECT_EQ(static_cast<char*>(s.data), static_cast<char*>(t.data()) + 5 * 4);
  EXPECT_EQ(t.view().slice(0, Shape{24}).data, t.data());
  EXPECT_EQ(static_cast<float*>(t.view().slice(23, Shape{1}).data), t.data_as<float>() + 23);
}

TEST(TensorView, OutOfRangeRowsAndSlicesAreClearErrors) {
  Tensor owner(DType::kFloat32, Shape{3, 2});
  const TensorView t = owner;
  EXPECT_QMESH_ERROR(t.rows(1, 4), "rows [1, 4) of a tensor of shape [3, 2]");
  EXPECT_QMESH_ERROR(t.rows(1, 4), "within its 3 rows");
  EXPECT_QMESH_ERROR(t.rows(-1, 2), "rows [-1, 2)");
  EXPECT_QMESH_ERROR(t.rows(2, 2), "take a non-empty range");
  EXPECT_QMESH_ERROR(t.slice(4, Shape{3}), "slice of 3 elements (shape [3]) from element 4");
  EXPECT_QMESH_ERROR(t.slice(4, Shape{3}), "it has 6 elements");
  EXPECT_QMESH_ERROR(t.slice(-1, Shape{1}), "from element -1");
  EXPECT_QMESH_ERROR(t.slice(7, Shape{1}), "from element 7");
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

// copy_rows_async: row i of `width` bytes from src + i * src_pitch to dst + i * dst_pitch,
// the bytes between rows untouched; a pitch shorter than a row is an error.
TEST(Tensor, CopyRowsMovesRowsBetweenPitches) {
  const std::vector<uint8_t> src = {1, 2, 3, 9, 4, 5, 6, 9, 7, 8, 9, 9};  // 3 rows, pitch 4
  std::vector<uint8_t> dst(15, 0);                                        // pitch 5
  copy_rows_async(dst.data(), 5, Device::host(), src.data(), 4, Device::host(), 3, 3, Stream{});
  EXPECT_EQ(dst, (std::vector<uint8_t>{1, 2, 3, 0, 0, 4, 5, 6, 0, 0, 7, 8, 9, 0, 0}));
  EXPECT_QMESH_ERROR(
      copy_rows_async(dst.data(), 2, Device::host(), src.data(), 4, Device::host(), 3, 3, Stream{}),
      "a pitch must hold a row");
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
