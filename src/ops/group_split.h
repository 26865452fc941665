// The group loop the grouped quantize ops share (ops/grouped_quantize.h): x holds the groups
// back to back, each group's part of x is viewed in its output's shape and quantized by the
// non-grouped op, so a group's bits are that op's bits on its rows by construction.
#pragma once

#include <cstdint>
#include <span>

#include "qmesh/error.h"
#include "qmesh/tensor.h"

namespace qmesh::detail {

// For every group g whose output has data (outs[g].data not empty(); shape_of(outs[g]) is
// the [rows, cols] of the part of x it quantizes), calls quantize(g, x_g, outs[g]) with x_g the
// next rows * cols elements of x, viewed as [rows, cols]. Checks first, before anything runs, that
// the groups' element counts add up to x.numel() and that every group's rows are a multiple of
// `row_block` (the op's block edge; 1 for none). `op` names the op in errors.
template <class Out, class ShapeOf, class Quantize>
void for_each_group(const TensorView& x, std::span<const Out> outs, int64_t row_block,
                    const char* op, ShapeOf&& shape_of, Quantize&& quantize) {
  int64_t total = 0;
  for (size_t g = 0; g < outs.size(); ++g) {
    if (outs[g].data.empty()) continue;
    const Shape shape = shape_of(outs[g]);
    QMESH_CHECK(shape.rows() % row_block == 0, op, ": group ", g, " has ", shape.rows(),
                " rows, not a multiple of ", row_block,
                ": every group's rows must be whole blocks; pad each group to a multiple of ",
                row_block, " rows");
    total += shape.numel();
  }
  QMESH_CHECK(total == x.numel(), op, ": the groups' outputs hold ", total, " elements but x ",
              x.shape.str(), " has ", x.numel(),
              "; give one output per group, shaped like its part of x");
  auto* at = static_cast<char*>(x.data);
  for (size_t g = 0; g < outs.size(); ++g) {
    if (outs[g].data.empty()) continue;
    const Shape shape = shape_of(outs[g]);
    quantize(g, TensorView(at, x.dtype, shape, x.device), outs[g]);
    at += shape.numel() * static_cast<int64_t>(dtype_size(x.dtype));
  }
}

}  // namespace qmesh::detail
