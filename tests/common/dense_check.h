// One check for the layer tests of the quantized recipes: a Dense layer's forward and backward
// on random data against the float64 reference of dense_reference.h, within tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dense_reference.h"
#include "mlp_harness.h"
#include "qmesh/layers/dense.h"
#include "qmesh/layers/layer_context.h"
#include "random_tensor.h"

namespace qmesh::test {

// Relative-norm bounds of the layer's results against float64.
struct DenseTolerance {
  double gemm;          // y, dx and dW (the quantized GEMMs)
  double db = 1e-5;     // the bias gradient (fp32 column sums)
  double min_y = 1e-4;  // y must be at least this far off: the operands were quantized
};

// The measured relative errors.
struct DenseErrors {
  double y, dx, dw, db;
};

// Builds Dense("d", in, out) on `ctx` (a tp = 1 mesh; layer seed 4) with a random bias, runs
// forward(x) and backward(dy) once on random x [T, in] and dy [T, out], and expects every
// result within `tol` of test::dense_reference of the fp32 values. Returns the errors.
inline DenseErrors expect_dense_matches_reference(LayerContext& ctx, int64_t T, int64_t in,
                                                  int64_t out, const DenseTolerance& tol) {
  using testing_mlp::doubles;
  using testing_mlp::rel_norm;
  const Tensor x = random_tensor(Shape{T, in}, 1);
  const Tensor dy = random_tensor(Shape{T, out}, 2);
  const Tensor bias = random_tensor(Shape{out}, 3);
  Dense dense("d", in, out, DenseOptions{}, ctx, 4);
  Parameter& b = *dense.parameters()[1];
  std::copy_n(bias.data_as<float>(), out, b.value.data_as<float>());
  const std::vector<double> y = doubles(dense.forward(x));
  const std::vector<double> dx = doubles(dense.backward(dy));
  const DenseReference want =
      dense_reference(x.data_as<float>(), dense.weight().value.data_as<float>(),
                      bias.data_as<float>(), dy.data_as<float>(), T, in, out);
  const DenseErrors e{rel_norm(y, want.y), rel_norm(dx, want.dx),
                      rel_norm(doubles(dense.weight().grad), want.dw),
                      rel_norm(doubles(b.grad), want.db)};
  EXPECT_LT(e.y, tol.gemm);
  EXPECT_LT(e.dx, tol.gemm);
  EXPECT_LT(e.dw, tol.gemm);
  EXPECT_LT(e.db, tol.db);
  EXPECT_GT(e.y, tol.min_y);
  return e;
}

}  // namespace qmesh::test
