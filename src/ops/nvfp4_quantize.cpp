// Argument checks and backend dispatch of the NVFP4 casts (ops/nvfp4_quantize.h). The kernels
// themselves are cpu/nvfp4_cast.cpp and cuda/nvfp4_cast.cu.
#include "qmesh/ops/nvfp4_quantize.h"

#include <algorithm>

#include "core/splitmix64.h"
#include "cpu/nvfp4_cast.h"
#include "cuda/nvfp4_cast.h"
#include "ops/check_wide.h"
#include "ops/nvfp4_cast_job.h"
#include "qmesh/detail/cuda_dispatch.h"

namespace qmesh {

namespace {

using detail::check_wide;

detail::NvFp4CopyOut copy_out(const TensorView& data, const TensorView& scale,
                              const TensorView& scale_inv) {
  return {static_cast<uint8_t*>(data.data), static_cast<uint8_t*>(scale.data),
          static_cast<float*>(scale_inv.data)};
}

// An fp32 [1] amax operand of nvfp4_quantize on x's device.
void check_amax(const TensorView& amax, const TensorView& x, const char* what) {
  check_dtype(amax, DType::kFloat32, what);
  check_shape(amax, Shape{1}, what);
  check_device(amax, x.device, what);
}

// NvFp4Options::origin and the whole shape (docs/design/nvfp4.md "Sharding"); a host origin's
// values too.
void check_origin(const NvFp4Options& o, const TensorView& x) {
  const int64_t rows = x.shape.rows(), cols = x.shape.cols();
  if (o.origin.empty()) {
    QMESH_CHECK(o.whole_rows == 0 && o.whole_cols == 0,
                "nvfp4_quantize: whole_rows and whole_cols are the shape of the whole tensor "
                "of which x is a shard, given only with origin (its place in it)");
    return;
  }
  check_dtype(o.origin, DType::kInt32, "nvfp4_quantize origin");
  check_shape(o.origin, Shape{2}, "nvfp4_quantize origin (x's first row and column)");
  check_device(o.origin, x.device, "nvfp4_quantize origin");
  check_nvfp4_shape(o.whole_rows, o.whole_cols,
                    "nvfp4_quantize whole tensor (of which x is a shard)");
  QMESH_CHECK(rows <= o.whole_rows && cols <= o.whole_cols, "nvfp4_quantize: x ", x.shape.str(),
              " is larger than the whole tensor [", o.whole_rows, ", ", o.whole_cols,
              "] it is a shard of");
  if (!x.device.is_host()) return;
  const int32_t* at = static_cast<const int32_t*>(o.origin.data);
  for (int d = 0; d < 2; ++d) {
    const int64_t size = d == 0 ? rows : cols, whole = d == 0 ? o.whole_rows : o.whole_cols;
    QMESH_CHECK(at[d] >= 0 && at[d] % detail::nvfp4::kBlock == 0 && at[d] + size <= whole,
                "nvfp4_quantize origin: x's first ", d == 0 ? "row" : "column", " ", at[d],
                " must be a multiple of 16 in [0, ", whole - size, "] (x spans ", size,
                " of the whole tensor's ", whole, ")");
  }
}

// The job's input and transform, shared by the cast and the amax.
detail::NvFp4CastJob input_job(const TensorView& x, const NvFp4Options& options) {
  detail::NvFp4CastJob job;
  job.in_dtype = x.dtype;
  job.in = x.data;
  job.rows = job.whole_rows = x.shape.rows();
  job.cols = job.whole_cols = x.shape.cols();
  job.rht_columnwise = options.rht;
  job.rht_signs = options.rht_signs;
  return job;
}

void run(const detail::NvFp4CastJob& job, const Device& device, Stream stream) {
  detail::dispatch(
      device, [&] { detail::cpu::nvfp4_cast(job); },
      [&](auto index) { detail::cuda::nvfp4_cast(index, job, stream); });
}

}  // namespace

uint16_t nvfp4_rht_signs(uint64_t seed) { return uint16_t(detail::splitmix64(seed) >> 48); }

NvFp4Options nvfp4_options(const NvFp4Config& config, NvFp4Role role, uint64_t seed,
                           uint64_t rht_seed) {
  NvFp4Options o;
  o.seed = seed;
  o.tiles_2d = role == NvFp4Role::kWeight && !config.disable_2d_quantization;
  o.stochastic_rounding = role == NvFp4Role::kGradient && !config.disable_stochastic_rounding;
  o.rht = role != NvFp4Role::kWeight && !config.disable_rht;
  o.rht_signs = o.rht ? nvfp4_rht_signs(rht_seed) : 0;
  return o;
}

void nvfp4_quantize(const TensorView& x, const NvFp4TensorView& out, const NvFp4Options& options,
                    Stream stream) {
  check_wide(x, "nvfp4_quantize input");
  check_nvfp4_shape(x.shape.rows(), x.shape.cols(), "nvfp4_quantize input");
  out.validate("nvfp4_quantize output");
  check_device(out.data, x.device, "nvfp4_quantize output (it must be on the input's device)");
  QMESH_CHECK(out.rows() == x.shape.rows() && out.cols() == x.shape.cols(),
              "nvfp4_quantize input must be a [", out.rows(), ", ", out.cols(),
              "] matrix like the NVFP4 output, got ", x.shape.str());
  QMESH_CHECK(!(options.rht && options.tiles_2d),
              "nvfp4_quantize: the random Hadamard transform is for the 1x16 blocks of wgrad "
              "operands, not 16x16 tiles (weights); turn one of rht and tiles_2d off");
  const bool transformed = options.rht && out.has_columnwise();
  if (!options.amax.empty()) check_amax(options.amax, x, "nvfp4_quantize amax");
  if (!options.columnwise_amax.empty()) {
    QMESH_CHECK(transformed,
                "nvfp4_quantize: columnwise_amax sets the per-tensor scale of the transformed "
                "columnwise copy; without rht or without that copy, amax sets every copy's");
    check_amax(options.columnwise_amax, x, "nvfp4_quantize columnwise_amax");
  }
  QMESH_CHECK(!transformed || options.amax.empty() == options.columnwise_amax.empty(),
              "nvfp4_quantize: with rht the transformed columnwise copy takes its own amax: give "
              "columnwise_amax (the whole tensor's transformed amax) with amax, or neither");
  check_origin(options, x);
  if (!options.seed_key.empty()) {
    check_dtype(options.seed_key, DType::kInt32, "nvfp4_quantize seed_key");
    check_shape(options.seed_key, Shape{2}, "nvfp4_quantize seed_key (two key words)");
    check_device(options.seed_key, x.device, "nvfp4_quantize seed_key");
  }
  detail::NvFp4CastJob job = input_job(x, options);
  if (!options.origin.empty()) {
    job.whole_rows = options.whole_rows;
    job.whole_cols = options.whole_cols;
    job.origin = static_cast<const int32_t*>(options.origin.data);
  }
  job.stochastic_rounding = options.stochastic_rounding;
  job.tiles_2d = options.tiles_2d;
  job.seed = options.seed;
  job.seed_key = static_cast<const uint32_t*>(options.seed_key.data);
  job.amax = static_cast<const float*>(options.amax.data);
  job.columnwise_amax = static_cast<const float*>(options.columnwise_amax.data);
  job.copies[0] = copy_out(out.data, out.scale, out.scale_inv);
  if (out.has_columnwise()) job.copies[1] = copy_out(out.data_t, out.scale_t, out.scale_inv_t);
  run(job, x.device, stream);
}

void nvfp4_amax(const TensorView& x, const TensorView& amax, const NvFp4Options& options,
                Stream stream) {
  check_wide(x, "nvfp4_amax input");
  check_nvfp4_shape(x.shape.rows(), x.shape.cols(), "nvfp4_amax input");
  check_dtype(amax, DType::kFloat32, "nvfp4_amax output");
  check_shape(amax, Shape{2}, "nvfp4_amax output (the rowwise and columnwise amaxes)");
  check_device(amax, x.device, "nvfp4_amax output");
  detail::NvFp4CastJob job = input_job(x, options);
  job.amax_out = static_cast<float*>(amax.data);
  run(job, x.device, stream);
}

void nvfp4_dequantize(const NvFp4TensorView& in, const TensorView& out, bool columnwise,
                      Stream stream) {
  in.validate("nvfp4_dequantize input");
  check_wide(out, "nvfp4_dequantize output");
  check_device(out, in.device(), "nvfp4_dequantize output");
  QMESH_CHECK(!columnwise || in.has_columnwise(),
              "nvfp4_dequantize: columnwise asked of an NVFP4 tensor without a columnwise copy");
  const int64_t rows = columnwise ? in.cols() : in.rows();
  const int64_t cols = columnwise ? in.rows() : in.cols();
  QMESH_CHECK(out.numel() == rows * cols, "nvfp4_dequantize output must have ", rows * cols,
              " elements (a [", rows, ", ", cols, "] copy), got ", out.shape.str());
  const detail::NvFp4CopyOut c = columnwise ? copy_out(in.data_t, in.scale_t, in.scale_inv_t)
                                            : copy_out(in.data, in.scale, in.scale_inv);
  detail::dispatch(
      in.device(),
      [&] {
        detail::cpu::nvfp4_dequantize(c.data, c.scale, c.scale_inv, rows, cols, out.data,
                                      out.dtype);
      },
      [&](auto index) {
        detail::cuda::nvfp4_dequantize(index, c.data, c.scale, c.scale_inv, rows, cols, out.data,
                                       out.dtype, stream);
      });
}

void nvfp4_hadamard16(const float* in, float* out, int64_t n, uint16_t signs, bool inverse) {
  QMESH_CHECK(n >= 0 && n % detail::nvfp4::kBlock == 0,
              "nvfp4_hadamard16 needs a multiple of 16 elements, got ", n);
  for (int64_t b = 0; b < n; b += detail::nvfp4::kBlock) {
    float v[detail::nvfp4::kBlock], w[detail::nvfp4::kBlock];
    std::copy(in + b, in + b + detail::nvfp4::kBlock, v);
    detail::nvfp4::hadamard16(v, signs, inverse, w);
    std::copy(w, w + detail::nvfp4::kBlock, out + b);
  }
}

}  // namespace qmesh
