// Argument checks and backend dispatch of norm_forward (ops/norm_forward.h); layer_norm_forward
// (ops/layer_norm.h) is its fp32 LayerNorm without codes.
#include "qmesh/ops/norm_forward.h"

#include <string>
#include <utility>

#include "cpu/norm.h"
#include "cuda/norm.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/ops/layer_norm.h"

namespace qmesh {

namespace {

void check_fp32_of(const TensorView& t, const Device& device, const Shape& shape,
                   const std::string& what) {
  check_not_empty(t, what);
  check_dtype(t, DType::kFloat32, what);
  check_device(t, device, what);
  check_shape(t, shape, what);
}

bool wide(DType t) { return t == DType::kFloat32 || t == DType::kBFloat16; }

}  // namespace

void norm_forward(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                  const NormSpec& spec, const NormOutputs& out, Stream stream) {
  check_not_empty(x, "norm_forward input");
  QMESH_CHECK(wide(x.dtype), "norm_forward input must be fp32 or bf16, got ", dtype_name(x.dtype));
  QMESH_CHECK(x.shape.rank() >= 1,
              "norm_forward input must have at least one dimension (the normalised one)");
  const Device device = x.device;
  const int64_t rows = x.shape.rows(), cols = x.shape.cols();
  const Shape matrix{rows, cols};
  QMESH_CHECK(spec.eps > 0, "norm_forward: eps must be > 0, got ", spec.eps);
  const bool rms = spec.type == NormType::kRmsNorm;
  check_fp32_of(gamma, device, Shape{cols}, "norm_forward gamma");
  if (rms) {
    QMESH_CHECK(beta.empty() && out.mean.empty(),
                "norm_forward: RMSNorm takes no beta and writes no mean: pass empty views");
  } else {
    check_fp32_of(beta, device, Shape{cols}, "norm_forward beta (LayerNorm)");
  }
  QMESH_CHECK(wide(out.y_dtype), "norm_forward: y_dtype must be fp32 or bf16, got ",
              dtype_name(out.y_dtype));
  const bool codes = !out.codes.data.empty();
  QMESH_CHECK(!out.y.empty() || codes || !out.amax.empty(),
              "norm_forward: nothing to write: set y, codes or amax");
  QMESH_CHECK(!codes || out.amax.empty(),
              "norm_forward: amax is for a call without codes (codes carry their own amax)");
  detail::NormJob job;
  job.x = x.data;
  job.x_dtype = x.dtype;
  job.gamma = gamma.data_as<float>();
  job.beta = rms ? nullptr : beta.data_as<float>();
  job.eps = spec.eps;
  job.zero_centered_gamma = spec.zero_centered_gamma;
  job.rows = rows;
  job.cols = cols;
  job.y_dtype = out.y_dtype;
  if (!out.y.empty()) {
    check_dtype(out.y, out.y_dtype, "norm_forward y (of y_dtype)");
    check_device(out.y, device, "norm_forward y");
    check_shape(out.y, x.shape, "norm_forward y (shaped like x)");
    job.y = out.y.data;
  }
  if (codes) {
    out.codes.validate("norm_forward codes");
    check_device(out.codes.data, device, "norm_forward codes");
    check_shape(out.codes.data, matrix, "norm_forward codes ([rows, cols] of x)");
    job.fp8 = out.codes.dtype();
    job.out = static_cast<uint8_t*>(out.codes.data.data);
    job.out_t = static_cast<uint8_t*>(out.codes.data_t.data);
    job.scale = out.codes.scale;
    job.scale_inv = out.codes.scale_inv;
    job.amax = out.codes.amax;
  } else if (!out.amax.empty()) {
    check_fp32_of(out.amax, device, Shape{1}, "norm_forward amax");
    job.amax = out.amax.data_as<float>();
  }
  if (!out.mean.empty()) {
    check_fp32_of(out.mean, device, Shape{rows}, "norm_forward mean ([rows] of x)");
    job.mean = out.mean.data_as<float>();
  }
  if (!out.rstd.empty()) {
    check_fp32_of(out.rstd, device, Shape{rows}, "norm_forward rstd ([rows] of x)");
    job.rstd = out.rstd.data_as<float>();
  }
  detail::dispatch(
      device, [&] { detail::cpu::norm_forward(job); },
      [&](auto index) { detail::cuda::norm_forward(index, job, stream); });
}

void layer_norm_forward(const TensorView& x, const TensorView& gamma, const TensorView& beta,
                        float eps, const TensorView& y, const TensorView& mean,
                        const TensorView& rstd, Stream stream) {
  check_dtype(x, DType::kFloat32, "layer_norm_forward input");
  for (const auto& [t, what] :
       {std::pair{y, "layer_norm_forward output"}, std::pair{mean, "layer_norm_forward mean"},
        std::pair{rstd, "layer_norm_forward rstd"}})
    check_not_empty(t, what);
  NormOutputs out;
  out.y = y;
  out.mean = mean;
  out.rstd = rstd;
  norm_forward(x, gamma, beta, NormSpec{NormType::kLayerNorm, eps, false}, out, stream);
}

}  // namespace qmesh
