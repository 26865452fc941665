// XLA FFI handlers of LayerNorm (qmesh::layer_norm_forward / layer_norm_backward, fp32) and of
// LayerNorm or RMSNorm fused with the FP8 cast of its output (qmesh::norm_forward, fp32 or
// bf16), as the LayerNorm-Dense modules use it.
//
// x of any rank is read as [rows, cols] with cols its last dimension; gamma, beta, dgamma and
// dbeta hold cols elements, mean and rstd rows elements (any shape with that count).
#include <string>

#include "ffi/ffi_support.h"
#include "qmesh/ops/layer_norm.h"
#include "qmesh/ops/norm_forward.h"

namespace qmesh::ffi {
namespace {

constexpr std::initializer_list<DType> kFp8 = {DType::kFloat8E4M3, DType::kFloat8E5M2};

// An fp32 buffer of `count` elements, viewed with `shape`; errors name `what` and the rule.
TensorView fp32_as(const AnyBuffer& b, const Where& w, const Shape& shape,
                   const std::string& what) {
  QMESH_CHECK(b.element_type() == xffi::DataType::F32, what,
              " must be float32 (qmesh's LayerNorm is fp32-only), got ",
              dtype_name(to_dtype(b.element_type(), what)));
  require_count(b, shape.numel(), what);
  return TensorView(b.untyped_data(), DType::kFloat32, shape, w.device);
}
TensorView fp32_as(Result<AnyBuffer>& b, const Where& w, const Shape& shape,
                   const std::string& what) {
  return fp32_as(*b, w, shape, what);
}

// x as its [rows, cols] view (fp32, at least 1-D, not empty).
TensorView matrix(const AnyBuffer& x, const Where& w, const std::string& what) {
  QMESH_CHECK(x.dimensions().size() != 0, what,
              " must have at least one dimension (the normalised one)");
  const TensorView v = view(x, w, what);
  return fp32_as(x, w, Shape{v.shape.rows(), v.shape.cols()}, what);
}

float checked_eps(float eps) {
  QMESH_CHECK(eps > 0.0f, "eps must be > 0, got ", eps);
  return eps;
}

// x, gamma, beta -> y (x's shape), mean, rstd.
void forward_impl(const Where& w, AnyBuffer x, AnyBuffer gamma, AnyBuffer beta, Result<AnyBuffer> y,
                  Result<AnyBuffer> mean, Result<AnyBuffer> rstd, float eps) {
  const TensorView in = matrix(x, w, "x");
  const int64_t rows = in.shape.rows(), cols = in.shape.cols();
  layer_norm_forward(in, fp32_as(gamma, w, Shape{cols}, "gamma ([cols] of x)"),
                     fp32_as(beta, w, Shape{cols}, "beta ([cols] of x)"), checked_eps(eps),
                     fp32_as(y, w, in.shape, "y (shaped like x)"),
                     fp32_as(mean, w, Shape{rows}, "mean ([rows] of x)"),
                     fp32_as(rstd, w, Shape{rows}, "rstd ([rows] of x)"), w.stream);
}

// dy, x, gamma, mean, rstd (from the forward) -> dx (x's shape), dgamma, dbeta.
void backward_impl(const Where& w, AnyBuffer dy, AnyBuffer x, AnyBuffer gamma, AnyBuffer mean,
                   AnyBuffer rstd, Result<AnyBuffer> dx, Result<AnyBuffer> dgamma,
                   Result<AnyBuffer> dbeta) {
  const TensorView in = matrix(x, w, "x");
  const int64_t rows = in.shape.rows(), cols = in.shape.cols();
  const Shape vec{cols};
  layer_norm_backward(fp32_as(dy, w, in.shape, "dy (shaped like x)"), in,
                      fp32_as(gamma, w, vec, "gamma ([cols] of x)"),
                      fp32_as(mean, w, Shape{rows}, "mean ([rows] of x)"),
                      fp32_as(rstd, w, Shape{rows}, "rstd ([rows] of x)"),
                      fp32_as(dx, w, in.shape, "dx (shaped like x)"),
                      fp32_as(dgamma, w, vec, "dgamma ([cols] of x)"),
                      fp32_as(dbeta, w, vec, "dbeta ([cols] of x)"), w.stream);
}

float* scalar(const AnyBuffer& b, const Where& w, const std::string& what) {
  return static_cast<float*>(fp32_as(b, w, Shape{1}, what).data);
}

// x (fp32 or bf16, at least 1-D) as its [rows, cols] view.
TensorView wide_matrix(const AnyBuffer& x, const Where& w) {
  QMESH_CHECK(x.dimensions().size() != 0,
              "x must have at least one dimension (the normalised one)");
  require_dtype(x, {DType::kFloat32, DType::kBFloat16}, "x");
  const TensorView v = view(x, w, "x");
  return TensorView(v.data, v.dtype, Shape{v.shape.rows(), v.shape.cols()}, w.device);
}

// LayerNorm (beta has cols elements) or RMSNorm (beta and mean are empty arrays) of x (fp32 or
// bf16) fused with the FP8 cast of its output y (qmesh::norm_forward): y is written in its
// buffer's dtype (fp32 or bf16) and rounded to it before the cast. With codes (q not empty):
// q (x's shape) and, when q_t is not empty, q_t [cols, rows] with the given scale, amax =
// max|y| of this call, scale_inv = 1 / scale. Without codes (q, q_t and scale_inv empty; scale
// unread): amax = max|y|, for current scaling's scale.
void norm_impl(const Where& w, AnyBuffer x, AnyBuffer gamma, AnyBuffer beta, AnyBuffer scale,
               Result<AnyBuffer> y, Result<AnyBuffer> q, Result<AnyBuffer> q_t,
               Result<AnyBuffer> amax, Result<AnyBuffer> scale_inv, Result<AnyBuffer> mean,
               Result<AnyBuffer> rstd, float eps) {
  const TensorView in = wide_matrix(x, w);
  const int64_t rows = in.shape.rows(), cols = in.shape.cols();
  const bool rms = element_count(beta) == 0;
  NormOutputs out;
  require_dtype(*y, {DType::kFloat32, DType::kBFloat16}, "y");
  require_count(*y, in.numel(), "y (the normalised output, shaped like x)");
  out.y_dtype = to_dtype(y->element_type(), "y");
  out.y = TensorView(y->untyped_data(), out.y_dtype, in.shape, w.device);
  if (element_count(*q) != 0) {
    require_dtype(*q, kFp8, "q");
    require_count(*q, in.numel(), "q (the codes, shaped like x)");
    QuantizedTensorView& codes = out.codes;
    codes.data =
        TensorView(q->untyped_data(), to_dtype(q->element_type(), "q"), in.shape, w.device);
    if (element_count(*q_t) != 0) {
      QMESH_CHECK(q_t->element_type() == q->element_type(),
                  "q_t (the columnwise copy) must have q's FP8 dtype");
      QMESH_CHECK(q_t->dimensions().size() == 2 && q_t->dimensions()[0] == cols &&
                      q_t->dimensions()[1] == rows,
                  "q_t (the columnwise copy) must be [cols, rows] = [", cols, ", ", rows,
                  "] of x's 2-D view, or an empty array for none");
      codes.data_t = TensorView(q_t->untyped_data(), codes.data.dtype, Shape{cols, rows}, w.device);
    }
    codes.scale = scalar(scale, w, "scale");  // read only
    codes.amax = scalar(*amax, w, "amax");
    codes.scale_inv = scalar(*scale_inv, w, "scale_inv");
    store_scalar(codes.amax, 0.0f, w);  // norm_forward keeps a running max
  } else {
    out.amax = fp32_as(amax, w, Shape{1}, "amax");
  }
  if (!rms) out.mean = fp32_as(mean, w, Shape{rows}, "mean ([rows] of x)");
  out.rstd = fp32_as(rstd, w, Shape{rows}, "rstd ([rows] of x)");
  const NormSpec spec{rms ? NormType::kRmsNorm : NormType::kLayerNorm, checked_eps(eps), false};
  norm_forward(in, fp32_as(gamma, w, Shape{cols}, "gamma ([cols] of x)"),
               rms ? TensorView() : fp32_as(beta, w, Shape{cols}, "beta ([cols] of x, or empty)"),
               spec, out, w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshLayerNormForward, qmesh::ffi::forward_impl,
                  .Arg<AnyBuffer>()      // x
                      .Arg<AnyBuffer>()  // gamma
                      .Arg<AnyBuffer>()  // beta
                      .Ret<AnyBuffer>()  // y
                      .Ret<AnyBuffer>()  // mean
                      .Ret<AnyBuffer>()  // rstd
                      .Attr<float>("eps"));

QMESH_FFI_HANDLER(QmeshLayerNormBackward, qmesh::ffi::backward_impl,
                  .Arg<AnyBuffer>()        // dy
                      .Arg<AnyBuffer>()    // x
                      .Arg<AnyBuffer>()    // gamma
                      .Arg<AnyBuffer>()    // mean
                      .Arg<AnyBuffer>()    // rstd
                      .Ret<AnyBuffer>()    // dx
                      .Ret<AnyBuffer>()    // dgamma
                      .Ret<AnyBuffer>());  // dbeta

QMESH_FFI_HANDLER(QmeshNormForward, qmesh::ffi::norm_impl,
                  .Arg<AnyBuffer>()      // x
                      .Arg<AnyBuffer>()  // gamma
                      .Arg<AnyBuffer>()  // beta (empty: RMSNorm)
                      .Arg<AnyBuffer>()  // scale
                      .Ret<AnyBuffer>()  // y
                      .Ret<AnyBuffer>()  // q (empty: no codes)
                      .Ret<AnyBuffer>()  // q_t
                      .Ret<AnyBuffer>()  // amax
                      .Ret<AnyBuffer>()  // scale_inv
                      .Ret<AnyBuffer>()  // mean (empty: RMSNorm)
                      .Ret<AnyBuffer>()  // rstd
                      .Attr<float>("eps"));
