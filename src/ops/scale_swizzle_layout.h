// cuBLASLt's tiled layout of 1-D block scales (the VEC32_UE8M0 mode of MXFP8 and the
// VEC16_UE4M3 mode of NVFP4; docs/design/gemm.md "Native microscaled GEMMs"), written once
// for the host twin and the CUDA kernel so that both produce the same bytes.
//
// A [rows, cols] scale matrix (rows: M or N of the operand; cols: its scale blocks along K;
// row-major, one byte per scale) is padded to [round_up(rows, 128), round_up(cols, 4)] and
// cut into tiles of 128 rows x 4 columns, each 512 contiguous bytes, the tiles in row-major
// order over (row tile, column tile). Inside a tile, the scale of tile row i (0..127) and
// tile column j (0..3) sits at byte (i % 32) * 16 + (i / 32) * 4 + j. Padding bytes are 0.
#pragma once

#include <cstdint>

#include "scaling/scale_rules.h"  // QMESH_HOST_DEVICE

namespace qmesh::detail {

inline constexpr int64_t kScaleTileRows = 128;
inline constexpr int64_t kScaleTileCols = 4;
inline constexpr int64_t kScaleTileBytes = kScaleTileRows * kScaleTileCols;

QMESH_HOST_DEVICE constexpr int64_t round_up_to(int64_t x, int64_t multiple) {
  return (x + multiple - 1) / multiple * multiple;
}

// Bytes of the swizzled form of a [rows, cols] scale matrix.
QMESH_HOST_DEVICE constexpr int64_t swizzled_scale_bytes(int64_t rows, int64_t cols) {
  return round_up_to(rows, kScaleTileRows) * round_up_to(cols, kScaleTileCols);
}

// The row-major index (r * cols + c) of the scale stored at byte `offset` of the swizzled
// form of a [rows, cols] scale matrix, or -1 for a padding byte.
QMESH_HOST_DEVICE constexpr int64_t swizzled_scale_source(int64_t offset, int64_t rows,
                                                          int64_t cols) {
  const int64_t col_tiles = round_up_to(cols, kScaleTileCols) / kScaleTileCols;
  const int64_t tile = offset / kScaleTileBytes;
  const int64_t in_tile = offset % kScaleTileBytes;
  const int64_t r = (tile / col_tiles) * kScaleTileRows + (in_tile % 16) / 4 * 32 + in_tile / 16;
  const int64_t c = (tile % col_tiles) * kScaleTileCols + in_tile % 4;
  return r < rows && c < cols ? r * cols + c : -1;
}

}  // namespace qmesh::detail
