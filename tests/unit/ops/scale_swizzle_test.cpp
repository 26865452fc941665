// The scale swizzle of the native microscaled GEMMs (ops/scale_swizzle.h) on the host, against
// a reference that writes the layout of docs/design/gemm.md in output order: tiles of 128 rows
// x 4 scale columns, row tiles outer; inside a tile, 32 groups of 16 bytes, group i holding
// rows i, i + 32, i + 64, i + 96, each as its 4 scale columns; padding 0.
#include "ops/scale_swizzle.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "expect_error.h"
#include "ops/scale_swizzle_layout.h"
#include "qmesh/tensor.h"

namespace qmesh {
namespace {

std::vector<uint8_t> reference_swizzle(const std::vector<uint8_t>& in, int64_t rows, int64_t cols) {
  std::vector<uint8_t> out;
  for (int64_t tile_row = 0; tile_row * 128 < rows; ++tile_row)
    for (int64_t tile_col = 0; tile_col * 4 < cols; ++tile_col)
      for (int64_t i = 0; i < 32; ++i)
        for (int64_t quarter = 0; quarter < 4; ++quarter)
          for (int64_t j = 0; j < 4; ++j) {
            const int64_t r = tile_row * 128 + quarter * 32 + i;
            const int64_t c = tile_col * 4 + j;
            out.push_back(r < rows && c < cols ? in[size_t(r * cols + c)] : 0);
          }
  return out;
}

struct Swizzled {
  std::vector<uint8_t> in, out;
};

Swizzled swizzle_random(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  Tensor scales(dtype, Shape{rows, cols});
  std::mt19937 rng(seed);
  auto* s = static_cast<uint8_t*>(scales.data());
  // Bytes 1..255: a 0 in the output is then padding, never a copied scale.
  for (int64_t i = 0; i < rows * cols; ++i) s[i] = uint8_t(1 + rng() % 255);
  Tensor out(dtype, detail::swizzled_scale_shape(rows, cols));
  detail::swizzle_block_scales(scales, out, Stream{});
  const auto* o = static_cast<const uint8_t*>(out.data());
  return {std::vector<uint8_t>(s, s + rows * cols),
          std::vector<uint8_t>(o, o + out.view().numel())};
}

// Odd sizes: one partial tile, exact tiles, partial tiles in both directions.
const int64_t kSizes[][2] = {{1, 1},   {5, 1},    {31, 3},  {32, 4},  {128, 4},
                             {129, 5}, {200, 13}, {256, 8}, {384, 2}, {97, 130}};

TEST(ScaleSwizzle, MatchesTheDocumentedLayoutForBothScaleTypes) {
  uint32_t seed = 1;
  for (DType dtype : {DType::kFloat8E8M0, DType::kFloat8E4M3})
    for (const auto& size : kSizes) {
      const Swizzled s = swizzle_random(dtype, size[0], size[1], seed++);
      EXPECT_EQ(s.out, reference_swizzle(s.in, size[0], size[1]))
          << dtype_name(dtype) << " [" << size[0] << ", " << size[1] << "]";
    }
}

TEST(ScaleSwizzle, PaddedShapeRoundsRowsTo128AndColumnsTo4) {
  EXPECT_EQ(detail::swizzled_scale_shape(1, 1), (Shape{128, 4}));
  EXPECT_EQ(detail::swizzled_scale_shape(128, 4), (Shape{128, 4}));
  EXPECT_EQ(detail::swizzled_scale_shape(129, 5), (Shape{256, 8}));
}

// Unswizzling (every output byte back to the source index it names) gives the input again,
// each input scale is stored exactly once, and every other byte is padding 0.
TEST(ScaleSwizzle, RoundTripsThroughTheInverseIndex) {
  for (const auto& size : kSizes) {
    const int64_t rows = size[0], cols = size[1];
    const Swizzled s = swizzle_random(DType::kFloat8E8M0, rows, cols, 77);
    std::vector<uint8_t> back(s.in.size(), 0);
    std::vector<int> hits(s.in.size(), 0);
    for (int64_t o = 0; o < int64_t(s.out.size()); ++o) {
      const int64_t src = detail::swizzled_scale_source(o, rows, cols);
      if (src < 0) {
        EXPECT_EQ(s.out[size_t(o)], 0) << "padding byte " << o;
        continue;
      }
      back[size_t(src)] = s.out[size_t(o)];
      ++hits[size_t(src)];
    }
    EXPECT_EQ(back, s.in) << "[" << rows << ", " << cols << "]";
    EXPECT_EQ(hits, std::vector<int>(s.in.size(), 1)) << "[" << rows << ", " << cols << "]";
  }
}

TEST(ScaleSwizzle, RefusesOtherDtypesAndShapes) {
  const Tensor fp32(DType::kFloat32, Shape{4, 4});
  const Tensor out32(DType::kFloat32, Shape{128, 4});
  EXPECT_QMESH_ERROR(detail::swizzle_block_scales(fp32, out32, Stream{}),
                     "fp8e8m0 (MXFP8) or fp8e4m3 (NVFP4)");
  const Tensor scales(DType::kFloat8E8M0, Shape{4, 4});
  const Tensor small(DType::kFloat8E8M0, Shape{4, 4});
  EXPECT_QMESH_ERROR(detail::swizzle_block_scales(scales, small, Stream{}), "[128, 4]");
  const Tensor other(DType::kFloat8E4M3, Shape{128, 4});
  EXPECT_QMESH_ERROR(detail::swizzle_block_scales(scales, other, Stream{}), "fp8e4m3");
}

}  // namespace
}  // namespace qmesh
