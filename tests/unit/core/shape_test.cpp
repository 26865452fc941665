#include "qmesh/shape.h"

#include <gtest/gtest.h>

#include <limits>

#include "expect_error.h"

namespace qmesh {
namespace {

TEST(Shape, NumelRowsCols) {
  const Shape s{2, 3, 4};
  EXPECT_EQ(s.rank(), 3);
  EXPECT_EQ(s.numel(), 24);
  EXPECT_EQ(s.rows(), 6);
  EXPECT_EQ(s.cols(), 4);
  EXPECT_EQ(s.dim(-1), 4);
  EXPECT_EQ(s.dim(0), 2);
  EXPECT_EQ(s.str(), "[2, 3, 4]");
  EXPECT_EQ(Shape().numel(), 1);
}

TEST(Shape, ZeroOrNegativeDimensionIsAnError) {
  EXPECT_QMESH_ERROR(Shape({4, 0}), "dimension 1 is 0; every dimension must be >= 1");
  EXPECT_QMESH_ERROR(Shape({-3}), "dimension 0 is -3");
}

TEST(Shape, OverflowingElementCountIsAnError) {
  const int64_t big = std::numeric_limits<int64_t>::max() / 2;
  EXPECT_QMESH_ERROR(Shape({big, 3}), "element count overflows int64");
}

TEST(Shape, DimensionIndexOutOfRange) {
  EXPECT_QMESH_ERROR(Shape({2, 3}).dim(2), "dimension index 2 is out of range for shape [2, 3]");
}

}  // namespace
}  // namespace qmesh
