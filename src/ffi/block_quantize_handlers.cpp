// XLA FFI handlers of block-scaled FP8 quantization (the Float8BlockScaling recipe,
// qmesh/ops/block_quantize.h): block quantize (optionally with the columnwise copy), block
// dbias + quantize, and block dequantize. Each calls the qmesh op on XLA's buffers (no copies).
//
// x is read as its row-major 2-D view [rows, cols]. Attribute `block`: 1 = 1x128 blocks,
// 2 = 128x128 tiles. The scale tensors are in the layout of qmesh/block_quantized_tensor.h
// (block_scale_shape); the quantizing handlers take them as operands too, aliased to the
// results and zero-filled by the caller: the ops write the scales of blocks only, so the
// padding keeps the caller's zeros.
#include <cstdint>
#include <string>

#include "ffi/ffi_support.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/ops/block_quantize.h"

namespace qmesh::ffi {
namespace {

BlockShape to_block(int32_t value) {
  QMESH_CHECK(value == 1 || value == 2, "block must be 1 (1x128 blocks) or 2 (128x128 tiles), not ",
              value);
  return value == 1 ? BlockShape::k1x128 : BlockShape::k128x128;
}

TensorView matrix_view(const AnyBuffer& x, const Where& w, const char* what) {
  const TensorView v = view(x, w, what);
  return TensorView(v.data, v.dtype, Shape{v.shape.rows(), v.shape.cols()}, w.device);
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

QMESH_FFI_HANDLER(QmeshBlockDequantize, qmesh::ffi::block_dequantize_impl,
                  .Arg<AnyBuffer>()      // q
                      .Arg<AnyBuffer>()  // scale_inv
                      .Ret<AnyBuffer>()  // out
                      .Attr<int32_t>("block"));
