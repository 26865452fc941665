// Argument checks, host loops and CUDA dispatch of the layer ops (layer_norm_backward, bias,
// gelu, add, convert, transpose; layer_norm_forward is in ops/norm_forward.cpp). The CUDA
// kernels are in cuda/layer_ops.cu.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "cpu/gelu.h"
#include "cuda/layer_kernels.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/float16.h"
#include "qmesh/ops/add.h"
#include "qmesh/ops/bias.h"
#include "qmesh/ops/convert.h"
#include "qmesh/ops/gelu.h"
#include "qmesh/ops/layer_norm.h"
#include "qmesh/ops/transpose.h"

namespace qmesh {

namespace {

// t: a non-empty fp32 tensor on `device`.
void check_fp32(const TensorView& t, const Device& device, const std::string& what) {
  check_not_empty(t, what);
  check_dtype(t, DType::kFloat32, what);
  check_device(t, device, what);
}

// Each argument: a non-empty fp32 tensor of `shape` on `device`; named "<op> <name>" in errors.
void check_args(std::string_view op, const Device& device, const Shape& shape,
                std::initializer_list<std::pair<TensorView, const char*>> args) {
  for (const auto& [t, name] : args) {
    const std::string what = detail::concat(op, " ", name);
    check_fp32(t, device, what);
    check_shape(t, shape, what);
  }
}

// t: a non-empty activation (fp32 or bf16) on `device`.
void check_activation(const TensorView& t, const Device& device, const std::string& what) {
  check_not_empty(t, what);
  QMESH_CHECK(t.dtype == DType::kFloat32 || t.dtype == DType::kBFloat16, what,
              " must be fp32 or bf16, got ", dtype_name(t.dtype));
  check_device(t, device, what);
}

bool is_bf16(const TensorView& t) { return t.dtype == DType::kBFloat16; }

// The host loops over activations convert kChunk elements at a time through fp32.
constexpr int64_t kChunk = 1024;

template <class F>
void for_each_chunk(int64_t n, F&& f) {
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) f(i0, std::min(kChunk, n - i0));
}

// out[0, n) = t's elements [i0, i0 + n) as fp32.
void load_fp32(const TensorView& t, int64_t i0, int64_t n, float* out) {
  if (is_bf16(t))
    bf16_to_fp32(static_cast<const uint16_t*>(t.data) + i0, out, static_cast<size_t>(n));
  else if (t.data_as<float>() + i0 != out)  // dgelu in place reads dy where it writes dx
    std::copy_n(t.data_as<float>() + i0, n, out);
}

// t's elements [i0, i0 + n) = in[0, n), rounded to nearest even for bf16.
void store_fp32(const float* in, const TensorView& t, int64_t i0, int64_t n) {
  if (is_bf16(t))
    fp32_to_bf16(in, static_cast<uint16_t*>(t.data) + i0, static_cast<size_t>(n));
  else
    std::copy_n(in, n, t.data_as<float>() + i0);
}

using detail::dispatch;

}  // namespace

void layer_norm_backward(const TensorView& dy, const TensorView& x, const TensorView& gamma,
                         const TensorView& mean, const TensorView& rstd, const TensorView& dx,
                         const TensorView& dgamma, const TensorView& dbeta, Stream stream,
                         const TensorView& residual) {
  check_fp32(x, x.device, "layer_norm_backward input");
  const int64_t rows = x.shape.rows(), cols = x.shape.cols();
  check_args("layer_norm_backward", x.device, x.shape,
             {{dy, "output gradient"}, {dx, "input gradient"}});
  QMESH_CHECK(dx.data != dy.data, "layer_norm_backward: dx must not alias dy");
  if (!residual.empty()) {
    check_args("layer_norm_backward", x.device, x.shape, {{residual, "residual gradient"}});
    QMESH_CHECK(residual.data != dx.data && residual.data != dy.data,
                "layer_norm_backward: the residual gradient must not alias dx or dy");
  }
  const float* res = residual.empty() ? nullptr : residual.data_as<float>();
  check_args("layer_norm_backward", x.device, Shape{cols},
             {{gamma, "gamma"}, {dgamma, "dgamma"}, {dbeta, "dbeta"}});
  check_args("layer_norm_backward", x.device, Shape{rows}, {{mean, "mean"}, {rstd, "rstd"}});
  const float* pdy = dy.data_as<float>();
  const float* px = x.data_as<float>();
  const float* g = gamma.data_as<float>();
  const float* mu = mean.data_as<float>();
  const float* rs = rstd.data_as<float>();
  float* pdx = dx.data_as<float>();
  float* dg = dgamma.data_as<float>();
  float* db = dbeta.data_as<float>();
  dispatch(
      x.device,
      [&] {
        std::fill_n(dg, cols, 0.0f);
        std::fill_n(db, cols, 0.0f);
        const float inv_n = 1.0f / float(cols);
        for (int64_t r = 0; r < rows; ++r) {
          const float* xr = px + r * cols;
          const float* dyr = pdy + r * cols;
          float* dxr = pdx + r * cols;
          const float m = mu[r], s = rs[r];
          float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
          for (int64_t c = 0; c < cols; ++c) {
            const float xhat = (xr[c] - m) * s;
            const float dxhat = dyr[c] * g[c];
            sum_dxhat += dxhat;
            sum_dxhat_xhat += dxhat * xhat;
            dg[c] += dyr[c] * xhat;
            db[c] += dyr[c];
          }
          for (int64_t c = 0; c < cols; ++c) {
            const float xhat = (xr[c] - m) * s;
            dxr[c] = s * (dyr[c] * g[c] - inv_n * sum_dxhat - xhat * inv_n * sum_dxhat_xhat);
          }
          if (res != nullptr)
            for (int64_t c = 0; c < cols; ++c) dxr[c] = res[r * cols + c] + dxr[c];
        }
      },
      [&](auto device) {
        detail::cuda::layer_norm_backward(device, pdy, px, g, mu, rs, res, pdx, dg, db, rows, cols,
                                          stream);
      });
}

void bias_grad(const TensorView& g, const TensorView& dbias, Stream stream) {
  check_fp32(g, g.device, "bias_grad gradient");
  const int64_t rows = g.shape.rows(), cols = g.shape.cols();
  check_args("bias_grad", g.device, Shape{cols}, {{dbias, "output"}});
  const float* p = g.data_as<float>();
  float* out = dbias.data_as<float>();
  dispatch(
      g.device,
      [&] {
        std::fill_n(out, cols, 0.0f);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) out[c] += p[r * cols + c];
      },
      [&](auto device) { detail::cuda::column_sums(device, p, out, rows, cols, stream); });
}

void add_bias(const TensorView& y, const TensorView& bias, Stream stream) {
  check_activation(y, y.device, "add_bias output");
  const int64_t rows = y.shape.rows(), cols = y.shape.cols();
  check_args("add_bias", y.device, Shape{cols}, {{bias, "bias"}});
  const float* b = bias.data_as<float>();
  dispatch(
      y.device,
      [&] {
        for (int64_t r = 0; r < rows; ++r)
          for_each_chunk(cols, [&](int64_t c0, int64_t n) {
            float v[kChunk];
            load_fp32(y, r * cols + c0, n, v);
            for (int64_t c = 0; c < n; ++c) v[c] += b[c0 + c];
            store_fp32(v, y, r * cols + c0, n);
          });
      },
      [&](auto device) {
        detail::cuda::add_bias(device, y.data, is_bf16(y), b, rows, cols, stream);
      });
}

void gelu(const TensorView& x, const TensorView& y, Stream stream) {
  check_activation(x, x.device, "gelu input");
  check_activation(y, x.device, "gelu output");
  check_shape(y, x.shape, "gelu output");
  QMESH_CHECK(x.data != y.data || x.dtype == y.dtype,
              "gelu: an output that aliases the input must have its dtype");
  const int64_t n = x.numel();
  dispatch(
      x.device,
      [&] {
        for_each_chunk(n, [&](int64_t i0, int64_t m) {
          float v[kChunk];
          load_fp32(x, i0, m, v);
          gelu_inplace(v, m);
          store_fp32(v, y, i0, m);
        });
      },
      [&](auto device) {
        detail::cuda::gelu(device, x.data, is_bf16(x), y.data, is_bf16(y), n, stream);
      });
}

void dgelu(const TensorView& dy, const TensorView& pre, const TensorView& dx, Stream stream) {
  check_activation(dy, dy.device, "dgelu output gradient");
  check_activation(pre, dy.device, "dgelu pre-activation");
  check_dtype(pre, dy.dtype, "dgelu pre-activation");
  check_shape(pre, dy.shape, "dgelu pre-activation");
  check_args("dgelu", dy.device, dy.shape, {{dx, "input gradient"}});
  float* out = dx.data_as<float>();
  const int64_t n = dy.numel();
  dispatch(
      dy.device,
      [&] {
        for_each_chunk(n, [&](int64_t i0, int64_t m) {
          float p[kChunk];
          load_fp32(dy, i0, m, out + i0);
          load_fp32(pre, i0, m, p);
          dgelu_mul_inplace(out + i0, p, m);
        });
      },
      [&](auto device) {
        detail::cuda::dgelu(device, dy.data, pre.data, is_bf16(dy), out, n, stream);
      });
}

void add(const TensorView& a, const TensorView& b, const TensorView& out, Stream stream) {
  check_fp32(a, a.device, "add first operand");
  check_args("add", a.device, a.shape, {{b, "second operand"}, {out, "output"}});
  const float* pa = a.data_as<float>();
  const float* pb = b.data_as<float>();
  float* po = out.data_as<float>();
  const int64_t n = a.numel();
  dispatch(
      a.device,
      [&] {
        for (int64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
      },
      [&](auto device) { detail::cuda::add(device, pa, pb, po, n, stream); });
}

void convert_to_bf16(const TensorView& in, const TensorView& out, Stream stream) {
  check_fp32(in, in.device, "convert_to_bf16 input");
  check_not_empty(out, "convert_to_bf16 output");
  check_dtype(out, DType::kBFloat16, "convert_to_bf16 output");
  check_device(out, in.device, "convert_to_bf16 output");
  QMESH_CHECK(out.numel() == in.numel(), "convert_to_bf16 output must hold ", in.numel(),
              " elements like the input ", in.shape.str(), ", got shape ", out.shape.str());
  const float* src = in.data_as<float>();
  auto* dst = static_cast<uint16_t*>(out.data);
  const int64_t n = in.numel();
  dispatch(
      in.device, [&] { fp32_to_bf16(src, dst, static_cast<size_t>(n)); },
      [&](auto device) { detail::cuda::convert_to_bf16(device, src, dst, n, stream); });
}

void convert_to_fp32(const TensorView& in, const TensorView& out, Stream stream) {
  check_not_empty(in, "convert_to_fp32 input");
  check_dtype(in, DType::kBFloat16, "convert_to_fp32 input");
  check_fp32(out, in.device, "convert_to_fp32 output");
  QMESH_CHECK(out.numel() == in.numel(), "convert_to_fp32 output must hold ", in.numel(),
              " elements like the input ", in.shape.str(), ", got shape ", out.shape.str());
  const auto* src = static_cast<const uint16_t*>(in.data);
  float* dst = out.data_as<float>();
  const int64_t n = in.numel();
  dispatch(
      in.device, [&] { bf16_to_fp32(src, dst, static_cast<size_t>(n)); },
      [&](auto device) { detail::cuda::convert_to_fp32(device, src, dst, n, stream); });
}

void transpose(const TensorView& in, const TensorView& out, Stream stream) {
  check_not_empty(in, "transpose input");
  check_not_empty(out, "transpose output");
  check_dtype(out, in.dtype, "transpose output");
  check_device(out, in.device, "transpose output");
  const int64_t rows = in.shape.rows(), cols = in.shape.cols();
  check_shape(out, Shape{cols, rows}, "transpose output");
  const size_t bytes = dtype_size(in.dtype);
  const auto* src = static_cast<const char*>(in.data);
  auto* dst = static_cast<char*>(out.data);
  QMESH_CHECK(src + in.nbytes() <= dst || dst + out.nbytes() <= src,
              "transpose output must not overlap the input");
  dispatch(
      in.device,
      [&] {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c)
            std::memcpy(dst + (c * rows + r) * bytes, src + (r * cols + c) * bytes, bytes);
      },
      [&](auto device) {
        detail::cuda::transpose(device, src, dst, rows, cols, static_cast<int>(bytes), stream);
      });
}

}  // namespace qmesh
