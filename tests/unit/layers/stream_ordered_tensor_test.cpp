// StreamOrderedTensor on the host (src/layers/stream_ordered_tensor.h): kept while the dtype,
// shape and device stay, reallocated when they change, empty after reset, moved without a copy.
#include "layers/stream_ordered_tensor.h"

#include <gtest/gtest.h>

#include <utility>

namespace qmesh {
namespace {

TEST(StreamOrderedTensor, KeepsItsStorageUntilTheShapeChangesOrItIsReset) {
  StreamOrderedTensor t;
  EXPECT_TRUE(t.empty());
  const TensorView a = t.ensure(DType::kFloat32, Shape{4, 8}, Device::host(), {});
  ASSERT_NE(a.data, nullptr);
  EXPECT_EQ(a.shape, (Shape{4, 8}));
  static_cast<float*>(a.data)[31] = 5.0f;  // all 32 elements are writable
  EXPECT_EQ(t.ensure(DType::kFloat32, Shape{4, 8}, Device::host(), {}).data, a.data);
  const TensorView b = t.ensure(DType::kBFloat16, Shape{4, 8}, Device::host(), {});
  EXPECT_EQ(b.dtype, DType::kBFloat16);
  EXPECT_EQ(b.nbytes(), 64u);
  StreamOrderedTensor moved = std::move(t);
  EXPECT_TRUE(t.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
  EXPECT_EQ(moved.view().data, b.data);
  moved.reset();
  EXPECT_TRUE(moved.empty());
  EXPECT_EQ(moved.view().data, nullptr);
}

}  // namespace
}  // namespace qmesh
