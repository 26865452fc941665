// Argument checks and backend dispatch of the MXFP8 casts (ops/mxfp8_quantize.h). The
// kernels themselves are cpu/mxfp8_cast.cpp and cuda/mxfp8_cast.cu.
#include "qmesh/ops/mxfp8_quantize.h"

#include <cmath>
#include <string>

#include "cpu/mxfp8_cast.h"
#include "cuda/mxfp8_cast.h"
#include "ops/mxfp8_cast_job.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/fp8.h"

namespace qmesh {

namespace {

void check_wide(const TensorView& t, const std::string& what) {
  check_not_empty(t, what);
  QMESH_CHECK(
      t.dtype == DType::kFloat32 || t.dtype == DType::kBFloat16 || t.dtype == DType::kFloat16, what,
      " must be fp32, bf16 or fp16, got ", dtype_name(t.dtype), "; convert it first");
}

detail::MxCastJob make_job(const TensorView& x, const MxFp8TensorView& out, float margin,
                           const char* op) {
  const std::string name(op);
  check_wide(x, name + " input");
  out.validate((name + " output").c_str());
  check_device(out.data, x.device, name + " output (the FP8 codes must be on the input's device)");
  const int64_t rows = out.data.shape.rows(), cols = out.data.shape.cols();
  QMESH_CHECK(x.shape.rows() == rows && x.shape.cols() == cols, op, " input must be a [", rows,
              ", ", cols, "] matrix like the MXFP8 output ", out.data.shape.str(), ", got ",
              x.shape.str());
  QMESH_CHECK(std::isfinite(margin) && margin >= 0.0f, op, ": margin must be finite and >= 0, got ",
              margin);
  detail::MxCastJob job;
  job.in_dtype = x.dtype;
  job.fp8 = out.dtype();
  job.scaled_max = fp8_max(out.dtype()) / std::exp2(margin);
  job.in = x.data;
  job.rows = rows;
  job.cols = cols;
  job.out = static_cast<uint8_t*>(out.data.data);
  job.scale = static_cast<uint8_t*>(out.scale.data);
  if (out.has_columnwise()) {
    job.out_t = static_cast<uint8_t*>(out.data_t.data);
    job.scale_t = static_cast<uint8_t*>(out.scale_t.data);
  }
  return job;
}

void run(const Device& device, const detail::MxCastJob& job, Stream stream) {
  detail::dispatch(
      device, [&] { detail::cpu::mxfp8_cast(job); },
      [&](auto index) { detail::cuda::mxfp8_cast(index, job, stream); });
}

}  // namespace

void mxfp8_quantize(const TensorView& x, const MxFp8TensorView& out, float margin, Stream stream) {
  run(x.device, make_job(x, out, margin, "mxfp8_quantize"), stream);
}

void mxfp8_dbias_quantize(const TensorView& g, const MxFp8TensorView& out, const TensorView& dbias,
                          float margin, Stream stream) {
  detail::MxCastJob job = make_job(g, out, margin, "mxfp8_dbias_quantize");
  check_not_empty(dbias, "mxfp8_dbias_quantize dbias");
  check_dtype(dbias, DType::kFloat32, "mxfp8_dbias_quantize dbias");
  check_device(dbias, g.device, "mxfp8_dbias_quantize dbias");
  check_shape(dbias, Shape{job.cols}, "mxfp8_dbias_quantize dbias");
  job.dbias = static_cast<float*>(dbias.data);
  run(g.device, job, stream);
}

void mxfp8_dequantize(const MxFp8TensorView& in, const TensorView& out, Stream stream) {
  in.validate("mxfp8_dequantize input");
  check_wide(out, "mxfp8_dequantize output");
  check_device(out, in.device(), "mxfp8_dequantize output");
  const int64_t rows = in.data.shape.rows(), cols = in.data.shape.cols();
  QMESH_CHECK(out.numel() == rows * cols, "mxfp8_dequantize output must have ", rows * cols,
              " elements like the MXFP8 input ", in.data.shape.str(), ", got ", out.shape.str());
  detail::MxDequantizeJob job;
  job.in = static_cast<const uint8_t*>(in.data.data);
  job.fp8 = in.dtype();
  job.scale = static_cast<const uint8_t*>(in.scale.data);
  job.rows = rows;
  job.cols = cols;
  job.out = out.data;
  job.out_dtype = out.dtype;
  detail::dispatch(
      in.device(), [&] { detail::cpu::mxfp8_dequantize(job); },
      [&](auto index) { detail::cuda::mxfp8_dequantize(index, job, stream); });
}

}  // namespace qmesh
