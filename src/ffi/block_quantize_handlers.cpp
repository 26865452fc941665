// XLA FFI handlers of block-scaled FP8 quantization (the Float8BlockScaling recipe,
// qmesh/ops/block_quantize.h): block quantize (optionally with the columnwise copy), block
// dbias + quantize, grouped block quantize (qmesh/ops/grouped_quantize.h) and block
// dequantize. Each calls the qmesh op on XLA's buffers (no copies).
//
// x is read as its row-major 2-D view [rows, cols]. Attribute `block`: 1 = 1x128 blocks,
// 2 = 128x128 tiles. The scale tensors are in the layout of qmesh/block_quantized_tensor.h
// (block_scale_shape); the quantizing handlers take them as operands too, aliased to the
// results and zero-filled by the caller: the ops write the scales of blocks only, so the
// padding keeps the caller's zeros.
#include <cstdint>
#include <string>
#include <vector>

#include "ffi/ffi_support.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/ops/grouped_quantize.h"

namespace qmesh::ffi {
namespace {

BlockShape to_block(int32_t value) {
  QMESH_CHECK(value == 1 || value == 2, "block must be 1 (1x128 blocks) or 2 (128x128 tiles), not ",
              value);
  return value == 1 ? BlockShape::k1x128 : BlockShape::k128x128;
}

// The block-scaled output of quantizing a [rows, cols] input: codes q, scale_inv, and (when
// q_t is not empty) the columnwise copy q_t [cols, rows] with scale_inv_t. Shapes and dtypes
// are checked by BlockQuantizedTensorView::validate inside the op.
BlockQuantizedTensorView block_output(const Where& w, const Shape& matrix, BlockShape block,
                                      Result<AnyBuffer>& q, Result<AnyBuffer>& scale_inv,
                                      Result<AnyBuffer>& q_t, Result<AnyBuffer>& scale_inv_t) {
  require_count(*q, matrix.numel(), "q (the codes, shaped like x)");
  BlockQuantizedTensorView out;
  out.block = block;
  out.data = TensorView(q->untyped_data(), to_dtype(q->element_type(), "q"), matrix, w.device);
  out.scale_inv = view(scale_inv, w, "scale_inv");
  if (element_count(*q_t) != 0) {
    out.data_t = view(q_t, w, "q_t (the columnwise copy)");
    out.scale_inv_t = view(scale_inv_t, w, "scale_inv_t (the columnwise copy's scales)");
  }
  return out;
}

// x -> q, scale_inv (and q_t, scale_inv_t): op block_quantize. The two scale operands are the
// zero-filled buffers the scale results alias.
void block_quantize_impl(const Where& w, AnyBuffer x, AnyBuffer /*scale_inv_zeros*/,
                         AnyBuffer /*scale_inv_t_zeros*/, Result<AnyBuffer> q,
                         Result<AnyBuffer> scale_inv, Result<AnyBuffer> q_t,
                         Result<AnyBuffer> scale_inv_t, int32_t block, bool power_2_scale,
                         float amax_epsilon) {
  const TensorView input = matrix_view(x, w, "x");
  block_quantize(input,
                 block_output(w, input.shape, to_block(block), q, scale_inv, q_t, scale_inv_t),
                 QParams{power_2_scale, amax_epsilon}, w.stream);
}

// g -> the block quantize of g plus dbias[c] = sum over rows of g[r, c] (fp32 [cols]).
void block_dbias_quantize_impl(const Where& w, AnyBuffer g, AnyBuffer /*scale_inv_zeros*/,
                               AnyBuffer /*scale_inv_t_zeros*/, Result<AnyBuffer> q,
                               Result<AnyBuffer> scale_inv, Result<AnyBuffer> q_t,
                               Result<AnyBuffer> scale_inv_t, Result<AnyBuffer> dbias,
                               int32_t block, bool power_2_scale, float amax_epsilon) {
  const TensorView input = matrix_view(g, w, "g");
  require_count(*dbias, input.shape.cols(), "dbias ([cols] of g)");
  block_dbias_quantize(
      input, block_output(w, input.shape, to_block(block), q, scale_inv, q_t, scale_inv_t),
      view(dbias, w, "dbias"), QParams{power_2_scale, amax_epsilon}, w.stream);
}

// The next `shape`'s scales of a flat scale buffer `scales` of `size` floats, from `at` on.
TensorView next_scales(float* scales, int64_t size, int64_t& at, const Shape& shape, const Where& w,
                       const char* what) {
  QMESH_CHECK(at + shape.numel() <= size, what, " holds ", size,
              " floats, too few for the groups' scales: size it as "
              "qmesh.jax.block_quantize.grouped_scale_size does");
  const TensorView v(scales + at, DType::kFloat32, shape, w.device);
  at += shape.numel();
  return v;
}

// x [rows, cols] holds groups of group_sizes[g] rows back to back; each is block-quantized as
// block_quantize of its rows (op grouped_block_quantize) into the same rows of q and, with a
// columnwise copy, into q_t as the groups' [cols, rows_g] transposes back to back (flat).
// scale_inv (scale_inv_t) is flat: group g's scales in block_scale_shape(rows_g, cols)
// (block_scale_shape(cols, rows_g)) back to back; the rest stays zero (the two operands after
// group_sizes are the zero-filled buffers they alias). Empty groups have no codes or scales.
void grouped_block_quantize_impl(const Where& w, AnyBuffer x, AnyBuffer group_sizes,
                                 AnyBuffer /*scale_inv_zeros*/, AnyBuffer /*scale_inv_t_zeros*/,
                                 Result<AnyBuffer> q, Result<AnyBuffer> scale_inv,
                                 Result<AnyBuffer> q_t, Result<AnyBuffer> scale_inv_t,
                                 int32_t block, bool power_2_scale, float amax_epsilon) {
  const TensorView input = matrix_view(x, w, "x");
  const int64_t cols = input.shape.cols();
  const std::vector<int32_t> rows = group_rows(w, group_sizes, input.shape.rows());
  const BlockShape shape = to_block(block);
  const DType fp8 = to_dtype(q->element_type(), "q");
  require_count(*q, input.numel(), "q (the codes, shaped like x)");
  const bool columnwise = element_count(*q_t) != 0;
  if (columnwise) {
    QMESH_CHECK(q_t->element_type() == q->element_type(), "q_t must have q's FP8 dtype");
    require_count(*q_t, input.numel(), "q_t (the groups' transposes, flat)");
  }
  require_dtype(*scale_inv, {DType::kFloat32}, "scale_inv");
  require_dtype(*scale_inv_t, {DType::kFloat32}, "scale_inv_t");
  auto* codes = static_cast<uint8_t*>(q->untyped_data());
  auto* codes_t = static_cast<uint8_t*>(q_t->untyped_data());
  auto* scales = static_cast<float*>(scale_inv->untyped_data());
  auto* scales_t = static_cast<float*>(scale_inv_t->untyped_data());
  const int64_t count = element_count(*scale_inv), count_t = element_count(*scale_inv_t);
  std::vector<BlockQuantizedTensorView> outs(rows.size());
  int64_t row = 0, at = 0, at_t = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    BlockQuantizedTensorView& out = outs[g];
    out.block = shape;
    if (rows[g] > 0) {  // an empty group keeps empty views
      out.data = TensorView(codes + row * cols, fp8, Shape{rows[g], cols}, w.device);
      out.scale_inv =
          next_scales(scales, count, at, block_scale_shape(rows[g], cols, shape), w, "scale_inv");
      if (columnwise) {
        out.data_t = TensorView(codes_t + row * cols, fp8, Shape{cols, rows[g]}, w.device);
        out.scale_inv_t = next_scales(scales_t, count_t, at_t,
                                      block_scale_shape(cols, rows[g], shape), w, "scale_inv_t");
      }
    }
    row += rows[g];
  }
  grouped_block_quantize(input, outs, QParams{power_2_scale, amax_epsilon}, w.stream);
}

// q, scale_inv -> out = code * scale_inv of its block (fp32, bf16 or fp16, shaped like q).
void block_dequantize_impl(const Where& w, AnyBuffer q, AnyBuffer scale_inv, Result<AnyBuffer> out,
                           int32_t block) {
  BlockQuantizedTensorView in;
  in.block = to_block(block);
  in.data = matrix_view(q, w, "q");
  in.scale_inv = view(scale_inv, w, "scale_inv");
  require_count(*out, element_count(q), "out (shaped like q)");
  block_dequantize(in, view(out, w, "out"), w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshBlockQuantize, qmesh::ffi::block_quantize_impl,
                  .Arg<AnyBuffer>()      // x
                      .Arg<AnyBuffer>()  // scale_inv zeros (aliased to scale_inv)
                      .Arg<AnyBuffer>()  // scale_inv_t zeros (aliased to scale_inv_t)
                      .Ret<AnyBuffer>()  // q
                      .Ret<AnyBuffer>()  // scale_inv
                      .Ret<AnyBuffer>()  // q_t
                      .Ret<AnyBuffer>()  // scale_inv_t
                      .Attr<int32_t>("block")
                      .Attr<bool>("power_2_scale")
                      .Attr<float>("amax_epsilon"));

QMESH_FFI_HANDLER(QmeshBlockDbiasQuantize, qmesh::ffi::block_dbias_quantize_impl,
                  .Arg<AnyBuffer>()      // g
                      .Arg<AnyBuffer>()  // scale_inv zeros (aliased to scale_inv)
                      .Arg<AnyBuffer>()  // scale_inv_t zeros (aliased to scale_inv_t)
                      .Ret<AnyBuffer>()  // q
                      .Ret<AnyBuffer>()  // scale_inv
                      .Ret<AnyBuffer>()  // q_t
                      .Ret<AnyBuffer>()  // scale_inv_t
                      .Ret<AnyBuffer>()  // dbias
                      .Attr<int32_t>("block")
                      .Attr<bool>("power_2_scale")
                      .Attr<float>("amax_epsilon"));

QMESH_FFI_HANDLER(QmeshGroupedBlockQuantize, qmesh::ffi::grouped_block_quantize_impl,
                  .Arg<AnyBuffer>()      // x
                      .Arg<AnyBuffer>()  // group_sizes
                      .Arg<AnyBuffer>()  // scale_inv zeros (aliased to scale_inv)
                      .Arg<AnyBuffer>()  // scale_inv_t zeros (aliased to scale_inv_t)
                      .Ret<AnyBuffer>()  // q
                      .Ret<AnyBuffer>()  // scale_inv
                      .Ret<AnyBuffer>()  // q_t
                      .Ret<AnyBuffer>()  // scale_inv_t
                      .Attr<int32_t>("block")
                      .Attr<bool>("power_2_scale")
                      .Attr<float>("amax_epsilon"));

QMESH_FFI_HANDLER(QmeshBlockDequantize, qmesh::ffi::block_dequantize_impl,
                  .Arg<AnyBuffer>()      // q
                      .Arg<AnyBuffer>()  // scale_inv
                      .Ret<AnyBuffer>()  // out
                      .Attr<int32_t>("block"));
