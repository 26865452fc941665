// Argument checks and backend dispatch of the cast ops (amax, quantize, cast_transpose,
// dbias_quantize, grouped_quantize, dequantize, and the GELU-fused casts of
// ops/activation_cast.h). The kernels themselves are in cpu/ and cuda/.
#include <string>
#include <vector>

#include "cpu/cast.h"
#include "cuda/cast.h"
#include "ops/cast_job.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/ops/activation_cast.h"
#include "qmesh/ops/amax.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/dbias_quantize.h"
#include "qmesh/ops/dequantize.h"
#include "qmesh/ops/grouped_quantize.h"
#include "qmesh/ops/quantize.h"

namespace qmesh {

namespace {

using detail::CastActivation;
using detail::CastJob;
using detail::CastSpec;

bool is_cast_input(DType d) {
  return d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16;
}

void check_input(const TensorView& x, const char* what) {
  check_not_empty(x, what);
  QMESH_CHECK(is_cast_input(x.dtype), what, " must be fp32, bf16 or fp16, got ",
              dtype_name(x.dtype), "; convert it first");
}

// x's [rows, cols] view must be out.data's.
void check_same_matrix(const TensorView& x, const QuantizedTensorView& out, const char* what) {
  QMESH_CHECK(x.shape.rows() == out.data.shape.rows() && x.shape.cols() == out.data.shape.cols(),
              what, " must be a [", out.data.shape.rows(), ", ", out.data.shape.cols(),
              "] matrix like the FP8 output ", out.data.shape.str(), ", got ", x.shape.str());
}

void check_output(const TensorView& x, const QuantizedTensorView& out, const char* what) {
  out.validate(what);
  check_device(out.data, x.device, std::string(what) + " (the FP8 output)");
}

CastJob make_job(const TensorView& x, const QuantizedTensorView& out) {
  CastJob job;
  job.in = x.data;
  job.rows = out.data.shape.rows();
  job.cols = out.data.shape.cols();
  job.out = static_cast<uint8_t*>(out.data.data);
  job.scale = out.scale;
  job.scale_inv = out.scale_inv;
  job.amax = out.amax;
  return job;
}

void run(const Device& device, const CastSpec& spec, std::span<const CastJob> jobs, Stream stream) {
  detail::dispatch(
      device, [&] { detail::cpu::cast(spec, jobs); },
      [&](auto index) { detail::cuda::cast(index, spec, jobs, stream); });
}

void check_amax_output(const TensorView& x, const TensorView& out) {
  check_not_empty(out, "amax output");
  check_dtype(out, DType::kFloat32, "amax output");
  QMESH_CHECK(out.numel() == 1, "amax output must hold one fp32 element, got shape ",
              out.shape.str());
  check_device(out, x.device, "amax output");
}

// *out = max|activate(x, pre)| over x's elements (replaced).
void amax_job(const TensorView& x, const TensorView* pre, const TensorView& out,
              CastActivation activation, Stream stream) {
  check_amax_output(x, out);
  CastJob job;
  job.in = x.data;
  job.pre = pre ? pre->data : nullptr;
  job.rows = 1;
  job.cols = x.numel();
  job.amax = static_cast<float*>(out.data);
  job.amax_update = detail::AmaxUpdate::kReplace;
  run(x.device, CastSpec{x.dtype, DType::kFloat8E4M3, activation}, {&job, 1}, stream);
}

// The pre-activation of a dgelu cast: dh's dtype, device and element count.
void check_pre(const TensorView& dh, const TensorView& pre, const char* op) {
  const std::string what = std::string(op) + " pre-activation";
  check_not_empty(pre, what.c_str());
  check_dtype(pre, dh.dtype, what);
  check_device(pre, dh.device, what);
  QMESH_CHECK(pre.numel() == dh.numel(), what, " must have the gradient's ", dh.numel(),
              " elements, got shape ", pre.shape.str());
}

void check_dbias(const TensorView& g, const TensorView& dbias) {
  check_not_empty(dbias, "dbias");
  check_dtype(dbias, DType::kFloat32, "dbias");
  check_device(dbias, g.device, "dbias");
  check_shape(dbias, Shape{g.shape.cols()}, "dbias");
}

}  // namespace

void amax(const TensorView& x, const TensorView& out, Stream stream) {
  check_input(x, "amax input");
  amax_job(x, nullptr, out, CastActivation::kNone, stream);
}

void quantize(const TensorView& x, const QuantizedTensorView& out, Stream stream) {
  check_input(x, "quantize input");
  check_output(x, out, "quantize output");
  check_same_matrix(x, out, "quantize input");
  const CastJob job = make_job(x, out);
  run(x.device, CastSpec{x.dtype, out.dtype()}, {&job, 1}, stream);
}

void cast_transpose(const TensorView& x, const QuantizedTensorView& out, Stream stream) {
  check_input(x, "cast_transpose input");
  check_output(x, out, "cast_transpose output");
  QMESH_CHECK(out.has_columnwise(),
              "cast_transpose output has no columnwise copy; create it with "
              "QuantizedTensor(..., columnwise=true) or call quantize for the rowwise layout only");
  check_same_matrix(x, out, "cast_transpose input");
  CastJob job = make_job(x, out);
  job.out_t = static_cast<uint8_t*>(out.data_t.data);
  run(x.device, CastSpec{x.dtype, out.dtype()}, {&job, 1}, stream);
}

void dbias_quantize(const TensorView& g, const QuantizedTensorView& out, const TensorView& dbias,
                    Stream stream) {
  check_input(g, "dbias_quantize gradient");
  check_output(g, out, "dbias_quantize output");
  check_same_matrix(g, out, "dbias_quantize gradient");
  check_dbias(g, dbias);
  CastJob job = make_job(g, out);
  if (out.has_columnwise()) job.out_t = static_cast<uint8_t*>(out.data_t.data);
  job.dbias = static_cast<float*>(dbias.data);
  run(g.device, CastSpec{g.dtype, out.dtype()}, {&job, 1}, stream);
}

void gelu_cast_transpose(const TensorView& pre, const QuantizedTensorView& out, Stream stream) {
  check_input(pre, "gelu_cast_transpose pre-activation");
  check_output(pre, out, "gelu_cast_transpose output");
  check_same_matrix(pre, out, "gelu_cast_transpose pre-activation");
  CastJob job = make_job(pre, out);
  if (out.has_columnwise()) job.out_t = static_cast<uint8_t*>(out.data_t.data);
  run(pre.device, CastSpec{pre.dtype, out.dtype(), CastActivation::kGelu}, {&job, 1}, stream);
}

void dgelu_dbias_cast_transpose(const TensorView& dh, const TensorView& pre,
                                const QuantizedTensorView& out, const TensorView& dbias,
                                Stream stream) {
  check_input(dh, "dgelu_dbias_cast_transpose gradient");
  check_pre(dh, pre, "dgelu_dbias_cast_transpose");
  check_output(dh, out, "dgelu_dbias_cast_transpose output");
  check_same_matrix(dh, out, "dgelu_dbias_cast_transpose gradient");
  check_dbias(dh, dbias);
  CastJob job = make_job(dh, out);
  job.pre = pre.data;
  if (out.has_columnwise()) job.out_t = static_cast<uint8_t*>(out.data_t.data);
  job.dbias = static_cast<float*>(dbias.data);
  run(dh.device, CastSpec{dh.dtype, out.dtype(), CastActivation::kDgelu}, {&job, 1}, stream);
}

void gelu_amax(const TensorView& pre, const TensorView& out, Stream stream) {
  check_input(pre, "gelu_amax pre-activation");
  amax_job(pre, nullptr, out, CastActivation::kGelu, stream);
}

void dgelu_amax(const TensorView& dh, const TensorView& pre, const TensorView& out, Stream stream) {
  check_input(dh, "dgelu_amax gradient");
  check_pre(dh, pre, "dgelu_amax");
  amax_job(dh, &pre, out, CastActivation::kDgelu, stream);
}

void grouped_quantize(const TensorView& x, std::span<const QuantizedTensorView> outs,
                      Stream stream) {
  check_input(x, "grouped_quantize input");
  QMESH_CHECK(!outs.empty(), "grouped_quantize needs at least one output group");
  std::vector<CastJob> jobs;
  jobs.reserve(outs.size());
  int64_t offset = 0;
  for (size_t g = 0; g < outs.size(); ++g) {
    const std::string what = "grouped_quantize output " + std::to_string(g);
    check_output(x, outs[g], what.c_str());
    QMESH_CHECK(outs[g].dtype() == outs[0].dtype(), what, " has dtype ",
                dtype_name(outs[g].dtype()), " but group 0 has ", dtype_name(outs[0].dtype()),
                "; one call quantizes every group to the same FP8 format");
    CastJob job = make_job(x, outs[g]);
    job.in = static_cast<const char*>(x.data) + offset * dtype_size(x.dtype);
    if (outs[g].has_columnwise()) job.out_t = static_cast<uint8_t*>(outs[g].data_t.data);
    offset += outs[g].data.numel();
    QMESH_CHECK(offset <= x.numel(), "grouped_quantize groups 0..", g, " hold ", offset,
                " elements but the input has only ", x.numel(),
                "; the group sizes must add up to the input size");
    jobs.push_back(job);
  }
  QMESH_CHECK(offset == x.numel(), "grouped_quantize groups hold ", offset,
              " elements in all but the input has ", x.numel(),
              "; the group sizes must add up to the input size");
  run(x.device, CastSpec{x.dtype, outs[0].dtype()}, jobs, stream);
}

void dequantize(const QuantizedTensorView& q, const TensorView& out, Stream stream) {
  QMESH_CHECK(q.scale_inv != nullptr, "dequantize input has no scale_inv pointer");
  check_not_empty(q.data, "dequantize input");
  QMESH_CHECK(is_fp8(q.data.dtype), "dequantize input must hold FP8 codes, got ",
              dtype_name(q.data.dtype));
  check_input(out, "dequantize output");
  check_device(out, q.device(), "dequantize output");
  QMESH_CHECK(out.numel() == q.data.numel(), "dequantize output must have ", q.data.numel(),
              " elements like the FP8 input ", q.data.shape.str(), ", got ", out.shape.str());
  const auto* in = static_cast<const uint8_t*>(q.data.data);
  detail::dispatch(
      q.device(),
      [&] {
        detail::cpu::dequantize(in, q.dtype(), q.scale_inv, out.data, out.dtype, out.numel());
      },
      [&](auto index) {
        detail::cuda::dequantize(index, in, q.dtype(), q.scale_inv, out.data, out.dtype,
                                 out.numel(), stream);
      });
}

}  // namespace qmesh
