// The host layer ops (LayerNorm forward/backward, bias gradient and add, GELU backward, add,
// bf16 conversions, bf16 activations) against float64 references written here, and their
// argument checks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "expect_error.h"
#include "layer_norm_run.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/float16.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/ops/add.h"
#include "qmesh/ops/bias.h"
#include "qmesh/ops/convert.h"
#include "qmesh/ops/gelu.h"
#include "qmesh/ops/layer_norm.h"
#include "qmesh/ops/transpose.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using test::LayerNormRun;
using test::random_tensor;

// |actual - expected| <= tol * max(1, |expected|), element by element.
void expect_close(const TensorView& actual, const std::vector<double>& expected, double tol) {
  ASSERT_EQ(actual.numel(), int64_t(expected.size()));
  for (int64_t i = 0; i < actual.numel(); ++i)
    EXPECT_NEAR(actual.data_as<float>()[i], expected[i], tol * std::max(1.0, std::abs(expected[i])))
        << "element " << i;
}

// Element (r, c) of the input is element (c, r) of the output, for 1-, 2-, 4- and 8-byte
// dtypes and shapes that are not multiples of anything.
TEST(LayerOps, TransposeMovesEveryElement) {
  for (DType dtype : {DType::kFloat8E4M3, DType::kBFloat16, DType::kFloat32, DType::kFloat64}) {
    const int64_t rows = 37, cols = 70;
    const size_t bytes = dtype_size(dtype);
    Tensor in(dtype, Shape{rows, cols}), out(dtype, Shape{cols, rows});
    auto* p = static_cast<uint8_t*>(in.data());
    for (size_t i = 0; i < in.nbytes(); ++i) p[i] = static_cast<uint8_t>(i * 131 + 7);
    transpose(in, out);
    const auto* q = static_cast<const uint8_t*>(out.data());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(std::memcmp(q + (c * rows + r) * bytes, p + (r * cols + c) * bytes, bytes), 0)
            << dtype_name(dtype) << " (" << r << ", " << c << ")";
  }
  Tensor a(DType::kFloat32, Shape{4, 6}), wrong(DType::kFloat32, Shape{4, 6});
  EXPECT_QMESH_ERROR(transpose(a, wrong), "transpose output");
  Tensor b(DType::kBFloat16, Shape{6, 4});
  EXPECT_QMESH_ERROR(transpose(a, b), "transpose output");
  EXPECT_QMESH_ERROR(transpose(a, a), "transpose output");
}

TEST(LayerOps, LayerNormForwardAndBackwardMatchFloat64) {
  const int64_t rows = 5, cols = 37;
  const LayerNormRun run(rows, cols);
  const double eps = LayerNormRun::kEps;

  std::vector<double> ey(rows * cols), emean(rows), erstd(rows), edx(rows * cols), edg(cols, 0.0),
      edb(cols, 0.0);
  const float* px = run.x.data_as<float>();
  const float* pg = run.gamma.data_as<float>();
  const float* pb = run.beta.data_as<float>();
  const float* pdy = run.dy.data_as<float>();
  for (int64_t r = 0; r < rows; ++r) {
    double m = 0, var = 0;
    for (int64_t c = 0; c < cols; ++c) m += px[r * cols + c];
    m /= cols;
    for (int64_t c = 0; c < cols; ++c) var += (px[r * cols + c] - m) * (px[r * cols + c] - m);
    var /= cols;
    const double s = 1.0 / std::sqrt(var + eps);
    emean[r] = m;
    erstd[r] = s;
    // dx = s * (g*dy - mean(g*dy) - xhat * mean(g*dy*xhat))
    double a = 0, b = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (px[r * cols + c] - m) * s;
      ey[r * cols + c] = xhat * pg[c] + pb[c];
      a += pg[c] * pdy[r * cols + c];
      b += pg[c] * pdy[r * cols + c] * xhat;
      edg[c] += pdy[r * cols + c] * xhat;
      edb[c] += pdy[r * cols + c];
    }
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (px[r * cols + c] - m) * s;
      edx[r * cols + c] = s * (pg[c] * pdy[r * cols + c] - a / cols - xhat * b / cols);
    }
  }
  expect_close(run.y, ey, 1e-5);
  expect_close(run.mean, emean, 1e-6);
  expect_close(run.rstd, erstd, 1e-5);
  expect_close(run.dx, edx, 1e-4);
  expect_close(run.dgamma, edg, 1e-5);
  expect_close(run.dbeta, edb, 1e-5);
}

// The residual gradient added in LayerNorm backward's dx pass: the bits of the separate add.
TEST(LayerOps, LayerNormBackwardAddsTheResidualAsTheSeparateAdd) {
  const int64_t rows = 9, cols = 70;
  const Tensor x = random_tensor(Shape{rows, cols}, 31), dy = random_tensor(Shape{rows, cols}, 32);
  const Tensor gamma = random_tensor(Shape{cols}, 33), beta = random_tensor(Shape{cols}, 34);
  const Tensor residual = random_tensor(Shape{rows, cols}, 35);
  Tensor y(DType::kFloat32, x.shape()), mean(DType::kFloat32, Shape{rows}),
      rstd(DType::kFloat32, Shape{rows});
  layer_norm_forward(x, gamma, beta, 1e-5f, y, mean, rstd);
  Tensor dx(DType::kFloat32, x.shape()), fused(DType::kFloat32, x.shape()),
      dgamma(DType::kFloat32, Shape{cols}), dbeta(DType::kFloat32, Shape{cols}),
      fused_dgamma(DType::kFloat32, Shape{cols}), fused_dbeta(DType::kFloat32, Shape{cols});
  layer_norm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
  add(residual, dx, dx);
  layer_norm_backward(dy, x, gamma, mean, rstd, fused, fused_dgamma, fused_dbeta, {}, residual);
  EXPECT_EQ(std::memcmp(fused.data(), dx.data(), dx.nbytes()), 0);
  EXPECT_EQ(std::memcmp(fused_dgamma.data(), dgamma.data(), dgamma.nbytes()), 0);
  EXPECT_EQ(std::memcmp(fused_dbeta.data(), dbeta.data(), dbeta.nbytes()), 0);
  EXPECT_QMESH_ERROR(layer_norm_backward(dy, x, gamma, mean, rstd, fused, fused_dgamma, fused_dbeta,
                                         {}, Tensor(DType::kFloat32, Shape{rows})),
                     "residual gradient");
  EXPECT_QMESH_ERROR(
      layer_norm_backward(dy, x, gamma, mean, rstd, fused, fused_dgamma, fused_dbeta, {}, fused),
      "must not alias");
}

TEST(LayerOps, BiasGradAndAddBiasMatchFloat64) {
  const int64_t rows = 300, cols = 7;
  const Tensor g = random_tensor(Shape{rows, cols}, 5);
  Tensor dbias(DType::kFloat32, Shape{cols});
  bias_grad(g, dbias);
  std::vector<double> sums(cols, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) sums[c] += g.data_as<float>()[r * cols + c];
  expect_close(dbias, sums, 1e-5);

  Tensor y = random_tensor(Shape{rows, cols}, 6);
  std::vector<double> expected(rows * cols);
  for (int64_t i = 0; i < rows * cols; ++i)
    expected[i] = double(y.data_as<float>()[i]) + g.data_as<float>()[i % cols];
  add_bias(y, TensorView(g.data(), DType::kFloat32, Shape{cols}));
  expect_close(y, expected, 1e-7);
}

TEST(LayerOps, GeluMatchesTheFloat64TanhApproximation) {
  const Shape shape{3, 40};
  const Tensor x = random_tensor(shape, 11, -6.0f, 6.0f);
  std::vector<double> expected(shape.numel());
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const double v = x.data_as<float>()[i];
    expected[i] = 0.5 * v * (1 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  }
  Tensor y(DType::kFloat32, shape);
  gelu(x, y);
  expect_close(y, expected, 1e-5);
}

TEST(LayerOps, DgeluMatchesTheFloat64TanhApproximation) {
  const Shape shape{4, 50};
  const Tensor dy = random_tensor(shape, 7), pre = random_tensor(shape, 8, -6.0f, 6.0f);
  std::vector<double> expected(shape.numel());
  for (int64_t i = 0; i < shape.numel(); ++i) {
    const double x = pre.data_as<float>()[i], k = std::sqrt(2.0 / M_PI);
    const double t = std::tanh(k * (x + 0.044715 * x * x * x));
    const double d = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * 0.044715 * x * x);
    expected[i] = dy.data_as<float>()[i] * d;
  }
  Tensor dx(DType::kFloat32, shape);
  dgelu(dy, pre, dx);
  expect_close(dx, expected, 1e-5);
  dgelu(dy, pre, dy);  // in place
  expect_close(dy, expected, 1e-5);
}

TEST(LayerOps, AddMatchesFloat64) {
  const Shape shape{3, 11};
  const Tensor a = random_tensor(shape, 9), b = random_tensor(shape, 10);
  std::vector<double> expected(shape.numel());
  for (int64_t i = 0; i < shape.numel(); ++i)
    expected[i] = double(a.data_as<float>()[i]) + b.data_as<float>()[i];
  Tensor out(DType::kFloat32, shape);
  add(a, b, out);
  expect_close(out, expected, 1e-7);
}

TEST(LayerOps, ConvertToBf16RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between bf16 1 and 1 + 2^-7: ties to even (1). 1 + 3·2^-8 -> 1 + 2^-6.
  const std::vector<float> in = {1.0f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, -2.5f, 0.0f, 3.0f};
  const std::vector<uint16_t> expected = {0x3F80, 0x3F80, 0x3F82, 0xC020, 0x0000, 0x4040};
  Tensor x(DType::kFloat32, Shape{int64_t(in.size())});
  std::memcpy(x.data(), in.data(), in.size() * sizeof(float));
  Tensor out(DType::kBFloat16, Shape{int64_t(in.size())});
  convert_to_bf16(x, out);
  for (size_t i = 0; i < in.size(); ++i)
    EXPECT_EQ(static_cast<const uint16_t*>(out.data())[i], expected[i]) << "element " << i;
}

// bf16 activations: each op reads bf16 as the values it holds and computes in fp32 (so the
// fp32 op on the widened values is the reference, itself checked against float64 above), and
// rounds a bf16 output to nearest even.
TEST(LayerOps, Bf16ActivationsAreTheFp32OpsOnTheirValues) {
  const Shape shape{5, 300};  // 1500 elements: more than one host chunk
  const int64_t n = shape.numel();
  auto narrow = [&](const TensorView& t) {
    Tensor out(DType::kBFloat16, t.shape);
    convert_to_bf16(t, out);
    return out;
  };
  auto widen = [&](const TensorView& t) {
    Tensor out(DType::kFloat32, t.shape);
    convert_to_fp32(t, out);
    return out;
  };
  auto same_bits = [](const TensorView& a, const TensorView& b, const char* what) {
    ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
    EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << what;
  };
  const Tensor pre16 = narrow(random_tensor(shape, 21, -6.0f, 6.0f));
  const Tensor dy16 = narrow(random_tensor(shape, 22));
  const Tensor pre = widen(pre16), dy = widen(dy16);
  for (int64_t i = 0; i < n; ++i)  // widening is exact
    EXPECT_EQ(float_to_bf16(pre.data_as<float>()[i]),
              static_cast<const uint16_t*>(pre16.data())[i]);

  Tensor act(DType::kFloat32, shape), act_from16(DType::kFloat32, shape);
  Tensor act16(DType::kBFloat16, shape);
  gelu(pre, act);
  gelu(pre16, act_from16);
  gelu(pre16, act16);
  same_bits(act_from16, act, "gelu of bf16 into fp32");
  same_bits(act16, narrow(act), "gelu into bf16");
  Tensor in_place = narrow(pre);
  gelu(in_place, in_place);
  same_bits(in_place, act16, "gelu in place on bf16");

  Tensor grad(DType::kFloat32, shape), grad_from16(DType::kFloat32, shape);
  dgelu(dy, pre, grad);
  dgelu(dy16, pre16, grad_from16);
  same_bits(grad_from16, grad, "dgelu of bf16");

  const Tensor bias = random_tensor(Shape{shape.cols()}, 23);
  Tensor y = widen(dy16), y16 = narrow(dy);
  add_bias(y, bias);
  add_bias(y16, bias);
  same_bits(y16, narrow(y), "add_bias on bf16");

  const Tensor half(DType::kFloat16, shape), fp32(DType::kFloat32, shape);
  EXPECT_QMESH_ERROR(gelu(half, act), "gelu input must be fp32 or bf16");
  EXPECT_QMESH_ERROR(gelu(in_place, TensorView(in_place.data(), DType::kFloat32, Shape{5, 150})),
                     "gelu output");
  EXPECT_QMESH_ERROR(dgelu(dy16, pre, grad), "dgelu pre-activation");
  EXPECT_QMESH_ERROR(dgelu(dy16, pre16, y16), "dgelu input gradient");
  EXPECT_QMESH_ERROR(add_bias(half, bias), "add_bias output must be fp32 or bf16");
  EXPECT_QMESH_ERROR(convert_to_fp32(fp32, act), "convert_to_fp32 input");
  EXPECT_QMESH_ERROR(convert_to_fp32(pre16, Tensor(DType::kFloat32, Shape{3})), "elements");
}

TEST(LayerOps, BadArgumentsAreRejected) {
  const Tensor x(DType::kFloat32, Shape{2, 4}), v4(DType::kFloat32, Shape{4}),
      v3(DType::kFloat32, Shape{3}), r2(DType::kFloat32, Shape{2});
  Tensor y(DType::kFloat32, Shape{2, 4});
  const Tensor half(DType::kBFloat16, Shape{2, 4});
  EXPECT_QMESH_ERROR(layer_norm_forward(x, v3, v4, 1e-5f, y, r2, r2), "gamma");
  EXPECT_QMESH_ERROR(layer_norm_forward(x, v4, v4, 0.0f, y, r2, r2), "eps");
  EXPECT_QMESH_ERROR(layer_norm_forward(x, v4, v4, 1e-5f, y, v4, r2), "mean");
  EXPECT_QMESH_ERROR(layer_norm_forward(half, v4, v4, 1e-5f, y, r2, r2), "input");
  EXPECT_QMESH_ERROR(layer_norm_backward(y, x, v4, r2, r2, y, v4, v4), "alias");
  EXPECT_QMESH_ERROR(
      layer_norm_backward(y, x, v4, r2, r2, Tensor(DType::kFloat32, Shape{4, 2}), v4, v4),
      "input gradient");
  EXPECT_QMESH_ERROR(bias_grad(x, v3), "bias_grad output");
  EXPECT_QMESH_ERROR(add_bias(y, v3), "add_bias bias");
  EXPECT_QMESH_ERROR(gelu(x, v4), "gelu output");
  EXPECT_QMESH_ERROR(dgelu(x, v4, y), "pre-activation");
  EXPECT_QMESH_ERROR(add(x, v4, y), "second operand");
  EXPECT_QMESH_ERROR(add(x, x, half), "output");
  EXPECT_QMESH_ERROR(convert_to_bf16(x, y), "convert_to_bf16 output");
  EXPECT_QMESH_ERROR(convert_to_bf16(x, Tensor(DType::kBFloat16, Shape{3})), "elements");
  // A CUDA operand next to host ones (or a CUDA device in a process without one).
  const TensorView on_gpu(y.data(), DType::kFloat32, Shape{2, 4}, Device::cuda(0));
  EXPECT_QMESH_ERROR(add(x, on_gpu, y), "second operand");
  if (cuda_device_count() == 0) EXPECT_QMESH_ERROR(add(on_gpu, on_gpu, on_gpu), "not available");
}

// Without a usable GPU, asking the layers or the ops for CUDA is an Error that says so (with a GPU,
// tests/gpu/layers_gpu_test.cpp covers these paths).
TEST(LayerOps, CudaPlacementWithoutAGpuIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  run_local_ranks(1, [](Communicator& comm) {
    Mesh mesh(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), {{"dp", 1}, {"tp", 1}});
    EXPECT_QMESH_ERROR(
        LayerContext(mesh, Recipe::kBf16, {.placement = Placement{Device::cuda(0), {}, {}}}),
        "not available");
  });
  float w = 1.0f, g = 0.5f;
  const TensorView on_gpu_w(&w, DType::kFloat32, Shape{1}, Device::cuda(0));
  const TensorView on_gpu_g(&g, DType::kFloat32, Shape{1}, Device::cuda(0));
  EXPECT_QMESH_ERROR(synchronize(Device::cuda(0)), "not available");
  EXPECT_QMESH_ERROR(add(on_gpu_w, on_gpu_w, on_gpu_g), "not available");
}

}  // namespace
}  // namespace qmesh
