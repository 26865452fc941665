// The layers' operand cast under the block and MXFP8 recipes makes the columnwise copy only
// where it is asked for: a sequence-parallel shard (whose copy nothing reads) and the weight
// of an FSDP forward are cast rowwise only, with the rowwise bits of the cast with the copy.
#include "layers/operand_cast.h"

#include <gtest/gtest.h>

#include <string_view>
#include <vector>

#include "qmesh/comm/local.h"
#include "random_tensor.h"

namespace qmesh {
namespace {

// The bytes of a host tensor.
std::vector<uint8_t> bytes(const TensorView& t) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  return std::vector<uint8_t>(p, p + t.nbytes());
}

bool has_columnwise(const GemmOperand& op) {
  return op.is_block_scaled() ? op.block.has_columnwise() : op.mx.has_columnwise();
}

// The rowwise codes and scales.
std::vector<std::vector<uint8_t>> rowwise(const GemmOperand& op) {
  if (op.is_block_scaled()) return {bytes(op.block.data), bytes(op.block.scale_inv)};
  return {bytes(op.mx.data), bytes(op.mx.scale)};
}

TEST(OperandCast, BlockAndMxfp8MakeTheColumnwiseCopyOnlyWhereAsked) {
  const Tensor x = test::random_tensor(Shape{64, 256}, 1);
  const Tensor dy = test::random_tensor(Shape{64, 256}, 2);
  for (Recipe recipe : {Recipe::kFp8Block, Recipe::kMxfp8}) {
    run_local_ranks(1, [&](Communicator& comm) {
      const Mesh mesh(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), {{"tp", 1}});
      LayerContext ctx(mesh, recipe);
      const std::string_view name = recipe_name(recipe);
      OperandCast input(ctx, OperandRole::kInput);
      const GemmOperand alone = input.cast(x, false);
      EXPECT_FALSE(has_columnwise(alone)) << name;
      const auto alone_bits = rowwise(alone);
      const GemmOperand both = input.cast(x, true);
      EXPECT_TRUE(has_columnwise(both)) << name;
      EXPECT_EQ(rowwise(both), alone_bits) << name;
      // The storage of the copy stays, but a rowwise cast hands out no copy.
      EXPECT_FALSE(has_columnwise(input.cast(x, false))) << name;
      // The gradient's cast with its bias gradient (a row-parallel shard's): the same sums.
      OperandCast grad(ctx, OperandRole::kGradOutput);
      Tensor dbias_alone(DType::kFloat32, Shape{256}), dbias_both(DType::kFloat32, Shape{256});
      CastFusion fusion;
      fusion.dbias = dbias_alone;
      const GemmOperand g_alone = grad.cast(dy, false, fusion);
      EXPECT_FALSE(has_columnwise(g_alone)) << name;
      const auto g_bits = rowwise(g_alone);
      fusion.dbias = dbias_both;
      const GemmOperand g_both = grad.cast(dy, true, fusion);
      EXPECT_TRUE(has_columnwise(g_both)) << name;
      EXPECT_EQ(rowwise(g_both), g_bits) << name;
      EXPECT_EQ(bytes(dbias_alone), bytes(dbias_both)) << name;
    });
  }
}

}  // namespace
}  // namespace qmesh
