// Argument checks and backend dispatch of the block-scaled casts (ops/block_quantize.h). The
// kernels themselves are cpu/block_cast.cpp and cuda/block_cast.cu.
#include "qmesh/ops/block_quantize.h"

#include <cmath>
#include <string>

#include "cpu/block_cast.h"
#include "cuda/block_cast.h"
#include "ops/block_cast_job.h"
#include "ops/check_wide.h"
#include "ops/group_split.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/ops/grouped_quantize.h"

namespace qmesh {

namespace {

using detail::check_wide;

void check_params(const QParams& params, const char* op) {
  QMESH_CHECK(std::isfinite(params.amax_epsilon) && params.amax_epsilon >= 0.0f, op,
              ": QParams.amax_epsilon must be finite and >= 0, got ", params.amax_epsilon);
}

// x (and out) checked; the job that casts x into out.
detail::BlockCastJob make_job(const TensorView& x, const BlockQuantizedTensorView& out,
                              const QParams& params, const char* op) {
  const std::string name(op);
  check_wide(x, (name + " input").c_str());
  out.validate((name + " output").c_str());
  check_device(out.data, x.device, name + " output (the FP8 codes must be on the input's device)");
  const int64_t rows = out.data.shape.rows(), cols = out.data.shape.cols();
  QMESH_CHECK(x.shape.rows() == rows && x.shape.cols() == cols, op, " input must be a [", rows,
              ", ", cols, "] matrix like the FP8 output ", out.data.shape.str(), ", got ",
              x.shape.str());
  check_params(params, op);
  detail::BlockCastJob job;
  job.in_dtype = x.dtype;
  job.fp8 = out.dtype();
  job.block = out.block;
  job.scaling.power_of_two_scales = params.power_2_scale;
  job.scaling.amax_epsilon = params.amax_epsilon;
  job.in = x.data;
  job.rows = rows;
  job.cols = cols;
  job.out = static_cast<uint8_t*>(out.data.data);
  job.scale_inv = static_cast<float*>(out.scale_inv.data);
  job.scale_ld = out.scale_inv.shape.cols();
  if (out.has_columnwise()) {
    job.out_t = static_cast<uint8_t*>(out.data_t.data);
    job.scale_inv_t = static_cast<float*>(out.scale_inv_t.data);
    job.scale_t_ld = out.scale_inv_t.shape.cols();
  }
  return job;
}

void run(const Device& device, const detail::BlockCastJob& job, Stream stream) {
  detail::dispatch(
      device, [&] { detail::cpu::block_cast(job); },
      [&](auto index) { detail::cuda::block_cast(index, job, stream); });
}

}  // namespace

void block_quantize(const TensorView& x, const BlockQuantizedTensorView& out, const QParams& params,
                    Stream stream) {
  run(x.device, make_job(x, out, params, "block_quantize"), stream);
}

void grouped_block_quantize(const TensorView& x, std::span<const BlockQuantizedTensorView> outs,
                            const QParams& params, Stream stream) {
  check_wide(x, "grouped_block_quantize input");
  detail::for_each_group(
      x, outs, 1, "grouped_block_quantize",
      [](const BlockQuantizedTensorView& out) { return out.data.shape; },
      [&](size_t, const TensorView& group, const BlockQuantizedTensorView& out) {
        run(x.device, make_job(group, out, params, "grouped_block_quantize"), stream);
      });
}

void block_dbias_quantize(const TensorView& g, const BlockQuantizedTensorView& out,
                          const TensorView& dbias, const QParams& params, Stream stream) {
  detail::BlockCastJob job = make_job(g, out, params, "block_dbias_quantize");
  check_not_empty(dbias, "block_dbias_quantize dbias");
  check_dtype(dbias, DType::kFloat32, "block_dbias_quantize dbias");
  check_device(dbias, g.device, "block_dbias_quantize dbias");
  check_shape(dbias, Shape{job.cols}, "block_dbias_quantize dbias");
  job.dbias = static_cast<float*>(dbias.data);
  run(g.device, job, stream);
}

void block_dequantize(const BlockQuantizedTensorView& in, const TensorView& out, Stream stream) {
  in.validate("block_dequantize input");
  check_wide(out, "block_dequantize output");
  check_device(out, in.device(), "block_dequantize output");
  const int64_t rows = in.data.shape.rows(), cols = in.data.shape.cols();
  QMESH_CHECK(out.numel() == rows * cols, "block_dequantize output must have ", rows * cols,
              " elements like the FP8 input ", in.data.shape.str(), ", got ", out.shape.str());
  const auto* codes = static_cast<const uint8_t*>(in.data.data);
  const auto* scale_inv = static_cast<const float*>(in.scale_inv.data);
  const int64_t ld = in.scale_inv.shape.cols();
  detail::dispatch(
      in.device(),
      [&] {
        detail::cpu::block_dequantize(codes, in.dtype(), in.block, scale_inv, ld, rows, cols,
                                      out.data, out.dtype);
      },
      [&](auto index) {
        detail::cuda::block_dequantize(index, codes, in.dtype(), in.block, scale_inv, ld, rows,
                                       cols, out.data, out.dtype, stream);
      });
}

}  // namespace qmesh
