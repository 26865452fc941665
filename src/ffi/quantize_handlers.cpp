// XLA FFI handlers of the quantization ops: quantize (rowwise, optionally with the columnwise
// copy), amax, the current-scaling scale, dequantize, dbias + quantize, grouped quantize, and
// the casts fused with GELU's forward and backward (ops/activation_cast.h).
// Each calls the qmesh op of the same name on the buffers XLA hands over (no copies).
//
// Operands that XLA gives as arrays of any rank are read as the row-major 2-D view
// [rows, cols] with cols the last dimension, as the ops do. Empty arrays never reach a
// handler: the Python primitives lower them to plain JAX.
#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "ffi/ffi_support.h"
#include "qmesh/fp8.h"
#include "qmesh/ops/activation_cast.h"
#include "qmesh/ops/amax.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/dbias_quantize.h"
#include "qmesh/ops/dequantize.h"
#include "qmesh/ops/grouped_quantize.h"
#include "qmesh/ops/quantize.h"
#include "qmesh/scaling/current_scaling.h"

namespace qmesh::ffi {
namespace {

constexpr std::initializer_list<DType> kWide = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};
constexpr std::initializer_list<DType> kFp8 = {DType::kFloat8E4M3, DType::kFloat8E5M2};

float* scalar(const AnyBuffer& b, const std::string& what) {
  require_dtype(b, {DType::kFloat32}, what);
  require_count(b, 1, what);
  return static_cast<float*>(b.untyped_data());
}
float* scalar(Result<AnyBuffer>& b, const std::string& what) { return scalar(*b, what); }

// The FP8 output of a quantizing handler for an input x read as [rows, cols]: codes q (x's
// element count), the columnwise copy q_t ([cols, rows]; an empty array when not wanted),
// the scale the caller gives, and amax / scale_inv results (amax reset to 0 first, so it is
// max|x| of this call).
QuantizedTensorView fp8_output(const Where& w, const Shape& matrix, const AnyBuffer& scale,
                               Result<AnyBuffer>& q, Result<AnyBuffer>& q_t,
                               Result<AnyBuffer>& amax, Result<AnyBuffer>& scale_inv) {
  require_dtype(*q, kFp8, "q");
  require_count(*q, matrix.numel(), "q (the codes, shaped like x)");
  QuantizedTensorView out;
  out.data = TensorView(q->untyped_data(), to_dtype(q->element_type(), "q"), matrix, w.device);
  if (element_count(*q_t) != 0) {
    QMESH_CHECK(q_t->element_type() == q->element_type(),
                "q_t (the columnwise copy) must have q's FP8 dtype");
    QMESH_CHECK(q_t->dimensions().size() == 2 && q_t->dimensions()[0] == matrix.cols() &&
                    q_t->dimensions()[1] == matrix.rows(),
                "q_t (the columnwise copy) must be [cols, rows] = [", matrix.cols(), ", ",
                matrix.rows(), "] of x's 2-D view");
    out.data_t = TensorView(q_t->untyped_data(), out.data.dtype,
                            Shape{matrix.cols(), matrix.rows()}, w.device);
  }
  // quantize only reads the scale.
  out.scale = const_cast<float*>(scalar(scale, "scale"));
  out.amax = scalar(amax, "amax");
  out.scale_inv = scalar(scale_inv, "scale_inv");
  store_scalar(out.amax, 0.0f, w);
  return out;
}

TensorView wide_input(const AnyBuffer& x, const Where& w, const char* what) {
  require_dtype(x, kWide, what);
  const TensorView v = view(x, w, what);
  return TensorView(v.data, v.dtype, Shape{v.shape.rows(), v.shape.cols()}, w.device);
}

// x -> q (and q_t) with the given scale: ops quantize / cast_transpose.
void quantize_impl(const Where& w, AnyBuffer x, AnyBuffer scale, Result<AnyBuffer> q,
                   Result<AnyBuffer> q_t, Result<AnyBuffer> amax, Result<AnyBuffer> scale_inv) {
  const TensorView input = wide_input(x, w, "x");
  const QuantizedTensorView out = fp8_output(w, input.shape, scale, q, q_t, amax, scale_inv);
  if (out.has_columnwise())
    cast_transpose(input, out, w.stream);
  else
    quantize(input, out, w.stream);
}

// max|x| -> amax (fp32 scalar).
void amax_impl(const Where& w, AnyBuffer x, Result<AnyBuffer> out) {
  const TensorView input = wide_input(x, w, "x");
  amax(input, TensorView(scalar(out, "amax"), DType::kFloat32, Shape{1}, w.device), w.stream);
}

// The current-scaling scale of each amax in an fp32 vector, for FP8 dtype `fp8_dtype`
// (qmesh's DType code: 3 = e4m3, 4 = e5m2).
void current_scale_impl(const Where& w, AnyBuffer amax, Result<AnyBuffer> scale, int32_t fp8_dtype,
                        bool power_of_two_scales, float amax_epsilon) {
  require_dtype(amax, {DType::kFloat32}, "amax");
  require_dtype(*scale, {DType::kFloat32}, "scale");
  const int64_t n = element_count(amax);
  require_count(*scale, n, "scale (one per amax)");
  const auto fp8 = static_cast<DType>(fp8_dtype);
  QMESH_CHECK(fp8 == DType::kFloat8E4M3 || fp8 == DType::kFloat8E5M2,
              "fp8_dtype must be 3 (e4m3) or 4 (e5m2), not ", fp8_dtype);
  const Float8CurrentScaling recipe{.power_of_two_scales = power_of_two_scales,
                                    .amax_epsilon = amax_epsilon};
  validate(recipe);
  auto* a = static_cast<float*>(amax.untyped_data());
  auto* s = static_cast<float*>(scale->untyped_data());
  for (int64_t i = 0; i < n; ++i) {
    QuantizedTensorView q;  // set_current_scale reads amax and writes scale only
    q.amax = a + i;
    q.scale = s + i;
    q.scale_inv = s + i;
    q.data = TensorView(s + i, fp8, Shape{1}, w.device);  // names the dtype; not written
    set_current_scale(q, recipe, w.stream);
  }
}

// q * scale_inv -> out (fp32, bf16 or fp16).
void dequantize_impl(const Where& w, AnyBuffer q, AnyBuffer scale_inv, Result<AnyBuffer> out) {
  require_dtype(q, kFp8, "q");
  require_dtype(*out, kWide, "out");
  require_count(*out, element_count(q), "out (shaped like q)");
  QuantizedTensorView in;
  in.data = view(q, w, "q");
  in.scale_inv = const_cast<float*>(scalar(scale_inv, "scale_inv"));  // read only
  dequantize(in, view(out, w, "out"), w.stream);
}

// g -> q (and q_t) as quantize, plus dbias[c] = sum over rows of g[r, c] (fp32 [cols]).
void dbias_quantize_impl(const Where& w, AnyBuffer g, AnyBuffer scale, Result<AnyBuffer> q,
                         Result<AnyBuffer> q_t, Result<AnyBuffer> amax, Result<AnyBuffer> scale_inv,
                         Result<AnyBuffer> dbias) {
  const TensorView input = wide_input(g, w, "g");
  const QuantizedTensorView out = fp8_output(w, input.shape, scale, q, q_t, amax, scale_inv);
  require_dtype(*dbias, {DType::kFloat32}, "dbias");
  require_count(*dbias, input.shape.cols(), "dbias ([cols] of g)");
  dbias_quantize(input, out, view(dbias, w, "dbias"), w.stream);
}

// pre -> the codes of gelu(pre) (and q_t) with the given scale: op gelu_cast_transpose.
void gelu_quantize_impl(const Where& w, AnyBuffer pre, AnyBuffer scale, Result<AnyBuffer> q,
                        Result<AnyBuffer> q_t, Result<AnyBuffer> amax,
                        Result<AnyBuffer> scale_inv) {
  const TensorView input = wide_input(pre, w, "pre");
  gelu_cast_transpose(input, fp8_output(w, input.shape, scale, q, q_t, amax, scale_inv), w.stream);
}

// max|gelu(pre)| -> amax (fp32 scalar).
void gelu_amax_impl(const Where& w, AnyBuffer pre, Result<AnyBuffer> out) {
  gelu_amax(wide_input(pre, w, "pre"),
            TensorView(scalar(out, "amax"), DType::kFloat32, Shape{1}, w.device), w.stream);
}

// The pre-activation, read as dh's [rows, cols] view (same dtype and element count as dh).
TensorView pre_activation(const AnyBuffer& pre, const TensorView& dh, const Where& w) {
  const TensorView p = wide_input(pre, w, "pre");
  QMESH_CHECK(p.dtype == dh.dtype && p.numel() == dh.numel(),
              "pre (the saved pre-activation) must have dh's dtype and shape: dh is ",
              dtype_name(dh.dtype), " with ", dh.numel(), " elements, pre ", dtype_name(p.dtype),
              " with ", p.numel());
  return TensorView(p.data, p.dtype, dh.shape, w.device);
}

// (dh, pre) -> the codes of g = dh * gelu'(pre) (and q_t) with the given scale, and
// dbias[c] = sum over rows of g[r, c]: op dgelu_dbias_cast_transpose.
void dgelu_dbias_quantize_impl(const Where& w, AnyBuffer dh, AnyBuffer pre, AnyBuffer scale,
                               Result<AnyBuffer> q, Result<AnyBuffer> q_t, Result<AnyBuffer> amax,
                               Result<AnyBuffer> scale_inv, Result<AnyBuffer> dbias) {
  const TensorView grad = wide_input(dh, w, "dh");
  const QuantizedTensorView out = fp8_output(w, grad.shape, scale, q, q_t, amax, scale_inv);
  require_dtype(*dbias, {DType::kFloat32}, "dbias");
  require_count(*dbias, grad.shape.cols(), "dbias ([cols] of dh)");
  dgelu_dbias_cast_transpose(grad, pre_activation(pre, grad, w), out, view(dbias, w, "dbias"),
                             w.stream);
}

// max|dh * gelu'(pre)| -> amax (fp32 scalar).
void dgelu_amax_impl(const Where& w, AnyBuffer dh, AnyBuffer pre, Result<AnyBuffer> out) {
  const TensorView grad = wide_input(dh, w, "dh");
  dgelu_amax(grad, pre_activation(pre, grad, w),
             TensorView(scalar(out, "amax"), DType::kFloat32, Shape{1}, w.device), w.stream);
}

// x [rows, cols] holds groups of group_sizes[g] rows back to back; each is quantized with
// scales[g] into the same rows of q, with amax[g] and scale_inv[g]. With a columnwise copy,
// q_t holds each group's [cols, rows_g] transpose back to back (flat). Empty groups get
// amax 0 and no codes.
void grouped_quantize_impl(const Where& w, AnyBuffer x, AnyBuffer group_sizes, AnyBuffer scales,
                           Result<AnyBuffer> q, Result<AnyBuffer> q_t, Result<AnyBuffer> amax,
                           Result<AnyBuffer> scale_inv) {
  const TensorView input = wide_input(x, w, "x");
  const std::vector<int32_t> rows = group_rows(w, group_sizes, input.shape.rows());
  const auto groups = static_cast<int64_t>(rows.size());
  for (const auto* b : {&scales}) require_dtype(*b, {DType::kFloat32}, "scales");
  require_count(scales, groups, "scales (one per group)");
  require_count(*amax, groups, "amax (one per group)");
  require_count(*scale_inv, groups, "scale_inv (one per group)");
  require_dtype(*amax, {DType::kFloat32}, "amax");
  require_dtype(*scale_inv, {DType::kFloat32}, "scale_inv");
  require_dtype(*q, kFp8, "q");
  require_count(*q, input.numel(), "q (the codes, shaped like x)");
  const int64_t cols = input.shape.cols();
  const bool columnwise = element_count(*q_t) != 0;
  if (columnwise) {
    QMESH_CHECK(q_t->element_type() == q->element_type(), "q_t must have q's FP8 dtype");
    require_count(*q_t, input.numel(), "q_t (the groups' transposes, flat)");
  }
  const int64_t total = input.shape.rows();

  const DType fp8 = to_dtype(q->element_type(), "q");
  auto* codes = static_cast<uint8_t*>(q->untyped_data());
  auto* codes_t = static_cast<uint8_t*>(q_t->untyped_data());
  auto* s = static_cast<float*>(scales.untyped_data());
  auto* a = static_cast<float*>(amax->untyped_data());
  auto* si = static_cast<float*>(scale_inv->untyped_data());
  const size_t in_bytes = dtype_size(input.dtype);
  std::vector<QuantizedTensorView> outs;
  int64_t start = 0;
  int64_t first = -1;
  for (int64_t g = 0; g < groups; ++g) {
    store_scalar(a + g, 0.0f, w);
    if (rows[g] == 0) {
      store_scalar(si + g, 1.0f, w);  // no codes: scale_inv unused; 1 is neutral
      continue;
    }
    if (first < 0) first = start;
    QuantizedTensorView out;
    out.data = TensorView(codes + start * cols, fp8, Shape{rows[g], cols}, w.device);
    if (columnwise)
      out.data_t = TensorView(codes_t + start * cols, fp8, Shape{cols, rows[g]}, w.device);
    out.scale = s + g;
    out.amax = a + g;
    out.scale_inv = si + g;
    outs.push_back(out);
    start += rows[g];
  }
  if (outs.empty()) return;
  // The non-empty groups cover the rows from the first one on, contiguously.
  const TensorView packed(static_cast<char*>(input.data) + first * cols * in_bytes, input.dtype,
                          Shape{total - first, cols}, w.device);
  grouped_quantize(packed, outs, w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshQuantize, qmesh::ffi::quantize_impl,
                  .Arg<AnyBuffer>()        // x
                      .Arg<AnyBuffer>()    // scale
                      .Ret<AnyBuffer>()    // q
                      .Ret<AnyBuffer>()    // q_t
                      .Ret<AnyBuffer>()    // amax
                      .Ret<AnyBuffer>());  // scale_inv

QMESH_FFI_HANDLER(QmeshAmax, qmesh::ffi::amax_impl,
                  .Arg<AnyBuffer>()        // x
                      .Ret<AnyBuffer>());  // amax

QMESH_FFI_HANDLER(QmeshCurrentScale, qmesh::ffi::current_scale_impl,
                  .Arg<AnyBuffer>()      // amax
                      .Ret<AnyBuffer>()  // scale
                      .Attr<int32_t>("fp8_dtype")
                      .Attr<bool>("power_of_two_scales")
                      .Attr<float>("amax_epsilon"));

QMESH_FFI_HANDLER(QmeshDequantize, qmesh::ffi::dequantize_impl,
                  .Arg<AnyBuffer>()        // q
                      .Arg<AnyBuffer>()    // scale_inv
                      .Ret<AnyBuffer>());  // out

QMESH_FFI_HANDLER(QmeshDbiasQuantize, qmesh::ffi::dbias_quantize_impl,
                  .Arg<AnyBuffer>()        // g
                      .Arg<AnyBuffer>()    // scale
                      .Ret<AnyBuffer>()    // q
                      .Ret<AnyBuffer>()    // q_t
                      .Ret<AnyBuffer>()    // amax
                      .Ret<AnyBuffer>()    // scale_inv
                      .Ret<AnyBuffer>());  // dbias

QMESH_FFI_HANDLER(QmeshGroupedQuantize, qmesh::ffi::grouped_quantize_impl,
                  .Arg<AnyBuffer>()        // x
                      .Arg<AnyBuffer>()    // group_sizes
                      .Arg<AnyBuffer>()    // scales
                      .Ret<AnyBuffer>()    // q
                      .Ret<AnyBuffer>()    // q_t
                      .Ret<AnyBuffer>()    // amax
                      .Ret<AnyBuffer>());  // scale_inv

QMESH_FFI_HANDLER(QmeshGeluQuantize, qmesh::ffi::gelu_quantize_impl,
                  .Arg<AnyBuffer>()        // pre
                      .Arg<AnyBuffer>()    // scale
                      .Ret<AnyBuffer>()    // q
                      .Ret<AnyBuffer>()    // q_t
                      .Ret<AnyBuffer>()    // amax
                      .Ret<AnyBuffer>());  // scale_inv

QMESH_FFI_HANDLER(QmeshGeluAmax, qmesh::ffi::gelu_amax_impl,
                  .Arg<AnyBuffer>()        // pre
                      .Ret<AnyBuffer>());  // amax

QMESH_FFI_HANDLER(QmeshDgeluDbiasQuantize, qmesh::ffi::dgelu_dbias_quantize_impl,
                  .Arg<AnyBuffer>()        // dh
                      .Arg<AnyBuffer>()    // pre
                      .Arg<AnyBuffer>()    // scale
                      .Ret<AnyBuffer>()    // q
                      .Ret<AnyBuffer>()    // q_t
                      .Ret<AnyBuffer>()    // amax
                      .Ret<AnyBuffer>()    // scale_inv
                      .Ret<AnyBuffer>());  // dbias

QMESH_FFI_HANDLER(QmeshDgeluAmax, qmesh::ffi::dgelu_amax_impl,
                  .Arg<AnyBuffer>()        // dh
                      .Arg<AnyBuffer>()    // pre
                      .Ret<AnyBuffer>());  // amax
