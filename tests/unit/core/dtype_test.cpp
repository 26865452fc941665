#include "qmesh/dtype.h"

#include <gtest/gtest.h>

#include "expect_error.h"

namespace qmesh {
namespace {

TEST(DType, SizesAndNamesRoundTrip) {
  const std::pair<DType, size_t> expected[] = {{DType::kFloat32, 4},    {DType::kFloat16, 2},
                                               {DType::kBFloat16, 2},   {DType::kFloat8E4M3, 1},
                                               {DType::kFloat8E5M2, 1}, {DType::kInt32, 4},
                                               {DType::kFloat64, 8},    {DType::kFloat4E2M1x2, 1}};
  for (auto [dtype, size] : expected) {
    EXPECT_EQ(dtype_size(dtype), size);
    EXPECT_EQ(parse_dtype(dtype_name(dtype)), dtype);
  }
  EXPECT_EQ(parse_dtype("e4m3"), DType::kFloat8E4M3);
  EXPECT_EQ(parse_dtype("e5m2"), DType::kFloat8E5M2);
}

TEST(DType, Classification) {
  EXPECT_TRUE(is_fp8(DType::kFloat8E4M3));
  EXPECT_TRUE(is_fp8(DType::kFloat8E5M2));
  EXPECT_FALSE(is_fp8(DType::kBFloat16));
  EXPECT_TRUE(is_wide_float(DType::kBFloat16));
  EXPECT_FALSE(is_wide_float(DType::kInt32));
}

TEST(DType, UnknownNameIsAnErrorListingChoices) {
  EXPECT_QMESH_ERROR(parse_dtype("fp4"), "unknown dtype 'fp4' (expected one of fp32");
}

TEST(DType, OutOfRangeValueIsAnError) {
  EXPECT_QMESH_ERROR(dtype_size(static_cast<DType>(42)), "unknown dtype value 42");
}

}  // namespace
}  // namespace qmesh
