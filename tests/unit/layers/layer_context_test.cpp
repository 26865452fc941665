// LayerContext's lifetime rules: it keeps its own copy of the mesh, so a context built from a
// temporary mesh works (before, it kept a reference to the destroyed mesh: a use after free
// that the AddressSanitizer build reports), and it can be neither copied nor moved (its layers
// refer to it).
#include "qmesh/layers/layer_context.h"

#include <gtest/gtest.h>

#include <type_traits>

#include "qmesh/comm/local.h"
#include "qmesh/layers/dense.h"

namespace qmesh {
namespace {

static_assert(!std::is_copy_constructible_v<LayerContext>);
static_assert(!std::is_move_constructible_v<LayerContext>);
static_assert(!std::is_copy_assignable_v<LayerContext>);

TEST(LayerContext, ATemporaryMeshIsKeptByTheContext) {
  const auto world = make_local_world(1)[0];
  LayerContext ctx(Mesh(world, {{"dp", 1}, {"tp", 1}}), Recipe::kFp8Delayed);
  EXPECT_EQ(ctx.mesh().axis_size("tp"), 1);
  EXPECT_EQ(ctx.mesh().axes().size(), 2u);
  Dense dense("d", 4, 4, {}, ctx, 1);  // reads the mesh's tp role
  Tensor x(DType::kFloat32, Shape{2, 4}), dy(x.dtype(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.data_as<float>()[i] = float(i) / 8.0f;
    dy.data_as<float>()[i] = 0.01f;
  }
  dense.forward(x);
  dense.backward(dy);
  ctx.end_step();  // the amax reduction over the mesh's amax group
  EXPECT_EQ(ctx.steps(), 1);
}

}  // namespace
}  // namespace qmesh
