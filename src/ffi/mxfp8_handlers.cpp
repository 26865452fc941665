// XLA FFI handlers of MXFP8 quantization (the MXFP8BlockScaling recipe,
// qmesh/ops/mxfp8_quantize.h): quantize (optionally with the columnwise copy), dbias +
// quantize, and dequantize. Each calls the qmesh op on XLA's buffers (no copies).
//
// x is read as its row-major 2-D view [rows, cols] (multiples of 32). Scales are
// float8_e8m0fnu [rows, cols / 32] (the columnwise copy's [cols, rows / 32]); without the
// columnwise copy q_t and scale_t are empty. Attribute `margin`: MXFP8BlockScaling.margin.
#include <cstdint>

#include "ffi/ffi_support.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/ops/mxfp8_quantize.h"

namespace qmesh::ffi {
namespace {

// The MXFP8 output of quantizing a [rows, cols] input; shapes and dtypes are checked by
// MxFp8TensorView::validate inside the op.
MxFp8TensorView mx_output(const Where& w, const Shape& matrix, Result<AnyBuffer>& q,
                          Result<AnyBuffer>& scale, Result<AnyBuffer>& q_t,
                          Result<AnyBuffer>& scale_t) {
  require_count(*q, matrix.numel(), "q (the codes, shaped like x)");
  MxFp8TensorView out;
  out.data = TensorView(q->untyped_data(), to_dtype(q->element_type(), "q"), matrix, w.device);
  out.scale = view(scale, w, "scale");
  if (element_count(*q_t) != 0) {
    out.data_t = view(q_t, w, "q_t (the columnwise copy)");
    out.scale_t = view(scale_t, w, "scale_t (the columnwise copy's scales)");
  }
  return out;
}

void mxfp8_quantize_impl(const Where& w, AnyBuffer x, Result<AnyBuffer> q, Result<AnyBuffer> scale,
                         Result<AnyBuffer> q_t, Result<AnyBuffer> scale_t, float margin) {
  const TensorView input = matrix_view(x, w, "x");
  mxfp8_quantize(input, mx_output(w, input.shape, q, scale, q_t, scale_t), margin, w.stream);
}

void mxfp8_dbias_quantize_impl(const Where& w, AnyBuffer g, Result<AnyBuffer> q,
                               Result<AnyBuffer> scale, Result<AnyBuffer> q_t,
                               Result<AnyBuffer> scale_t, Result<AnyBuffer> dbias, float margin) {
  const TensorView input = matrix_view(g, w, "g");
  require_count(*dbias, input.shape.cols(), "dbias ([cols] of g)");
  mxfp8_dbias_quantize(input, mx_output(w, input.shape, q, scale, q_t, scale_t),
                       view(dbias, w, "dbias"), margin, w.stream);
}

void mxfp8_dequantize_impl(const Where& w, AnyBuffer q, AnyBuffer scale, Result<AnyBuffer> out) {
  MxFp8TensorView in;
  in.data = matrix_view(q, w, "q");
  in.scale = view(scale, w, "scale");
  require_count(*out, element_count(q), "out (shaped like q)");
  mxfp8_dequantize(in, view(out, w, "out"), w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshMxfp8Quantize, qmesh::ffi::mxfp8_quantize_impl,
                  .Arg<AnyBuffer>()      // x
                      .Ret<AnyBuffer>()  // q
                      .Ret<AnyBuffer>()  // scale
                      .Ret<AnyBuffer>()  // q_t
                      .Ret<AnyBuffer>()  // scale_t
                      .Attr<float>("margin"));

QMESH_FFI_HANDLER(QmeshMxfp8DbiasQuantize, qmesh::ffi::mxfp8_dbias_quantize_impl,
                  .Arg<AnyBuffer>()      // g
                      .Ret<AnyBuffer>()  // q
                      .Ret<AnyBuffer>()  // scale
                      .Ret<AnyBuffer>()  // q_t
                      .Ret<AnyBuffer>()  // scale_t
                      .Ret<AnyBuffer>()  // dbias
                      .Attr<float>("margin"));

QMESH_FFI_HANDLER(QmeshMxfp8Dequantize, qmesh::ffi::mxfp8_dequantize_impl,
                  .Arg<AnyBuffer>()      // q
                      .Arg<AnyBuffer>()  // scale
                      .Ret<AnyBuffer>()  // out
);
