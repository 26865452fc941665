// bf16 activations (LayerContextOptions::activation_dtype, DenseOptions::output_dtype): a dense
// layer reads a bf16 input as the values it holds and rounds its bf16 output and input gradient
// from the fp32 ones it would otherwise return; the options are checked.
#include <gtest/gtest.h>

#include <vector>

#include "expect_error.h"
#include "mlp_harness.h"
#include "qmesh/comm/local.h"
#include "qmesh/float16.h"
#include "qmesh/layers/dense.h"
#include "qmesh/ops/convert.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

using testing_mlp::borrowed;

// t's values, bf16 or fp32, as fp32.
std::vector<float> values(const TensorView& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  if (t.dtype == DType::kBFloat16)
    bf16_to_fp32(static_cast<const uint16_t*>(t.data), v.data(), v.size());
  else
    v.assign(t.data_as<float>(), t.data_as<float>() + t.numel());
  return v;
}

// An fp32 tensor of values that bf16 holds exactly, and its bf16 copy.
struct Bf16Values {
  Tensor fp32, bf16;
  Bf16Values(const Shape& shape, uint32_t seed)
      : fp32(test::random_tensor(shape, seed)), bf16(DType::kBFloat16, shape) {
    convert_to_bf16(fp32, bf16);
    bf16_to_fp32(static_cast<const uint16_t*>(bf16.data()), fp32.data_as<float>(),
                 size_t(fp32.numel()));
  }
};

struct DenseRun {
  std::vector<float> y, dx, dw, db;
};

DenseRun run_dense(Recipe recipe, DType dtype, const Bf16Values& x, const Bf16Values& dy) {
  DenseRun out;
  run_local_ranks(1, [&](Communicator& comm) {
    LayerContext ctx(Mesh(borrowed(comm), {{"tp", 1}}), recipe);
    DenseOptions options;
    options.output_dtype = dtype;
    Dense dense("d", 40, 24, options, ctx, 3);
    const bool bf16 = dtype == DType::kBFloat16;
    out.y = values(dense.forward(bf16 ? x.bf16 : x.fp32));
    out.dx = values(dense.backward(bf16 ? dy.bf16 : dy.fp32));
    out.dw = values(dense.parameters()[0]->grad);
    out.db = values(dense.parameters()[1]->grad);
  });
  return out;
}

// Rounds every value to bf16 and back.
std::vector<float> rounded(std::vector<float> v) {
  for (float& f : v) f = bf16_to_float(float_to_bf16(f));
  return v;
}

TEST(ActivationDtype, DenseReadsBf16AsItsValuesAndRoundsItsOutputs) {
  const Bf16Values x(Shape{36, 40}, 1), dy(Shape{36, 24}, 2);
  for (Recipe recipe : {Recipe::kBf16, Recipe::kFp8Delayed, Recipe::kFp8Current}) {
    const DenseRun wide = run_dense(recipe, DType::kFloat32, x, dy);
    const DenseRun narrow = run_dense(recipe, DType::kBFloat16, x, dy);
    // The same operands, the same fp32 accumulators (the bias starts at 0: its bf16 copy in
    // the bf16 output's epilogue is exact), rounded once.
    EXPECT_EQ(narrow.y, rounded(wide.y)) << recipe_name(recipe);
    EXPECT_EQ(narrow.dx, rounded(wide.dx)) << recipe_name(recipe);
    EXPECT_EQ(narrow.dw, wide.dw) << recipe_name(recipe);
    EXPECT_EQ(narrow.db, wide.db) << recipe_name(recipe);
    EXPECT_NE(narrow.y, wide.y) << recipe_name(recipe) << ": the output was not rounded";
  }
}

TEST(ActivationDtype, DefaultsFollowTheRecipeAndOtherDtypesAreErrors) {
  run_local_ranks(1, [&](Communicator& comm) {
    const Mesh mesh(borrowed(comm), {{"tp", 1}});
    EXPECT_EQ(LayerContext(mesh, Recipe::kFp32).activation_dtype(), DType::kFloat32);
    EXPECT_EQ(LayerContext(mesh, Recipe::kBf16).activation_dtype(), DType::kBFloat16);
    EXPECT_EQ(LayerContext(mesh, Recipe::kFp8Delayed).activation_dtype(), DType::kBFloat16);
    EXPECT_EQ(LayerContext(mesh, Recipe::kFp8Current).activation_dtype(), DType::kBFloat16);
    EXPECT_EQ(LayerContext(mesh, Recipe::kFp8Current, {.activation_dtype = DType::kFloat32})
                  .activation_dtype(),
              DType::kFloat32);
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kBf16, {.activation_dtype = DType::kFloat16}),
                       "activation_dtype must be fp32 or bf16");
    EXPECT_QMESH_ERROR(LayerContext(mesh, Recipe::kFp32, {.activation_dtype = DType::kBFloat16}),
                       "the fp32 recipe keeps fp32 activations");
    {
      LayerContext fp32(mesh, Recipe::kFp32);
      DenseOptions narrow;
      narrow.output_dtype = DType::kBFloat16;
      EXPECT_QMESH_ERROR(Dense("d", 4, 4, narrow, fp32, 1), "the fp32 recipe's GEMMs write fp32");
    }

    LayerContext ctx(mesh, Recipe::kBf16);
    DenseOptions row;
    row.parallelism = DenseParallelism::kRow;
    row.output_dtype = DType::kBFloat16;
    EXPECT_QMESH_ERROR(Dense("d", 4, 4, row, ctx, 1), "set output_dtype fp32");
    DenseOptions fp16;
    fp16.output_dtype = DType::kFloat16;
    EXPECT_QMESH_ERROR(Dense("d", 4, 4, fp16, ctx, 1), "output_dtype must be fp32 or bf16");

    DenseOptions column;
    column.parallelism = DenseParallelism::kColumn;
    Dense col("col", 4, 4, column, ctx, 1);
    EXPECT_QMESH_ERROR(col.forward(Tensor(DType::kBFloat16, Shape{2, 4})),
                       "column-parallel layer takes an fp32 input");

    DenseOptions gelu;
    gelu.activation = DenseActivation::kGelu;
    gelu.output_dtype = DType::kBFloat16;
    Dense act("act", 4, 4, gelu, ctx, 1);
    Tensor x(DType::kFloat32, Shape{2, 4});
    for (int64_t i = 0; i < x.numel(); ++i) x.data_as<float>()[i] = 0.25f * float(i);
    act.forward(x);
    EXPECT_QMESH_ERROR(act.backward(Tensor(DType::kFloat32, Shape{2, 4})),
                       "pass a gradient of that dtype");
    EXPECT_QMESH_ERROR(act.forward(Tensor(DType::kFloat16, Shape{2, 4})), "fp32 or bf16");
  });
}

}  // namespace
}  // namespace qmesh
