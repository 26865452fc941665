// Dense::forward with a residual: y = x · Wᵀ + b + residual against a float64 reference; at
// tp = 1 the residual and the bias go into the GEMM (D's old value, accumulated, and the
// epilogue), which the host backend offers for every recipe.
#include <gtest/gtest.h>

#include <vector>

#include "expect_error.h"
#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/layers/dense.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using testing_mlp::borrowed;
using testing_mlp::doubles;
using testing_mlp::rel_norm;

TEST(DenseResidual, AtTp1TheGemmAddsTheResidualAndTheBias) {
  const int64_t T = 20, in = 32, out = 24;
  const Tensor x = test::random_tensor(Shape{T, in}, 1);
  const Tensor residual = test::random_tensor(Shape{T, out}, 2);
  const Tensor bias = test::random_tensor(Shape{out}, 3);
  for (Recipe recipe : {Recipe::kFp32, Recipe::kBf16, Recipe::kFp8Delayed, Recipe::kFp8Current}) {
    for (DenseParallelism p : {DenseParallelism::kRow, DenseParallelism::kNone}) {
      run_local_ranks(1, [&](Communicator& comm) {
        LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), recipe);
        DenseOptions options;
        options.parallelism = p;
        Dense dense("d", in, out, options, ctx, 4);
        Parameter& b = *dense.parameters()[1];
        std::copy_n(bias.data_as<float>(), out, b.value.data_as<float>());
        const std::vector<double> y = doubles(dense.forward(x, residual));
        EXPECT_EQ(dense.forward_epilogue(), DenseEpilogue::kFused) << recipe_name(recipe);
        // float64: x · Wᵀ + b + residual, from the fp32 values.
        const float* w = dense.weight().value.data_as<float>();
        std::vector<double> want(size_t(T * out));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t o = 0; o < out; ++o) {
            double s = double(bias.data_as<float>()[o]) + residual.data_as<float>()[t * out + o];
            for (int64_t k = 0; k < in; ++k)
              s += double(x.data_as<float>()[t * in + k]) * w[o * in + k];
            want[size_t(t * out + o)] = s;
          }
        // fp32: rounding; bf16: operands (and the bf16 bias of a bf16 output's epilogue) at
        // 2^-9; FP8: e4m3 operands.
        const double tol = recipe == Recipe::kFp32 ? 1e-6 : recipe == Recipe::kBf16 ? 1e-2 : 5e-2;
        EXPECT_LT(rel_norm(y, want), tol) << recipe_name(recipe);
      });
    }
  }
}

TEST(DenseResidual, BadResidualsAreClearErrors) {
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), Recipe::kBf16);
    const Tensor x(DType::kFloat32, Shape{4, 8});
    Dense plain("d", 8, 6, {}, ctx, 1);
    EXPECT_QMESH_ERROR(plain.forward(x, Tensor(DType::kFloat32, Shape{4, 5})), "d residual");
    EXPECT_QMESH_ERROR(plain.forward(x, Tensor(DType::kBFloat16, Shape{4, 6})), "d residual");
    DenseOptions gelu;
    gelu.activation = DenseActivation::kGelu;
    Dense act("act", 8, 6, gelu, ctx, 1);
    EXPECT_QMESH_ERROR(act.forward(x, Tensor(DType::kFloat32, Shape{4, 6})), "without GELU");
    DenseOptions narrow;
    narrow.output_dtype = DType::kBFloat16;
    Dense half("half", 8, 6, narrow, ctx, 1);
    EXPECT_QMESH_ERROR(half.forward(x, Tensor(DType::kFloat32, Shape{4, 6})),
                       "set output_dtype fp32");
  });
}

}  // namespace
}  // namespace qmesh
