// The global amax reduction with ranks as processes under mpirun -np 4, laid out as
// dp x tp = 2 x 2: every rank starts from different local amaxes; afterwards every rank's
// scales are identical and equal to a float64 reference computed from the global max, and a
// counting communicator shows one collective per reduction whatever the number of tensors.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "counting_communicator.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/comm/mpi.h"
#include "qmesh/scaling/amax_reducer.h"

namespace qmesh {
namespace {

std::shared_ptr<Communicator> world() {
  static std::shared_ptr<Communicator> w = make_mpi_world();
  return w;
}

// Rank r's local amax of operand i at step s; operand n-1 never runs (amax 0 everywhere).
float local_amax(int rank, int i, int step, int n) {
  if (i == n - 1) return 0.0f;
  return std::ldexp(1.0f + 0.125f * float((rank * 5 + i + step) % 7),
                    (rank * 3 + i + step) % 11 - 5);
}

// Operand i is a gradient (E5M2) when i % 3 == 2, else a forward operand (E4M3).
std::vector<OperandRole> roles(int n) {
  std::vector<OperandRole> r(n, OperandRole::kInput);
  for (int i = 2; i < n; i += 3) r[i] = OperandRole::kGradOutput;
  return r;
}

TEST(AmaxReducerMpi, DpTimesTpRanksAgreeWithTheGlobalMaxReference) {
  ASSERT_EQ(world()->size(), 4) << "run with mpirun -np 4";
  Mesh mesh(world(), {{"dp", 2}, {"tp", 2}});
  for (int n : {1, 10, 1000}) {
    auto counting = std::make_shared<testing::CountingCommunicator>(mesh.amax_group());
    const AmaxReducer reducer = AmaxReducer::with_group_override(counting);
    DelayedScaling recipe;
    recipe.amax_history_len = 8;
    recipe.margin = 1.0f;
    ScalingStates states(recipe, roles(n));
    constexpr int kSteps = 10;
    for (int step = 0; step < kSteps; ++step) {
      float* amax = states.current_amax().data_as<float>();
      for (int i = 0; i < n; ++i) amax[i] = local_amax(world()->rank(), i, step, n);
      reducer.reduce_and_update(states);
      ASSERT_EQ(counting->collectives(), step + 1) << n << " tensors";
      ASSERT_EQ(counting->all_reduces(), step + 1) << n << " tensors";
    }
    // Every rank's scales, gathered (outside the counted communicator).
    constexpr int64_t kSlot = QuantizedTensor::kScalarSlot;  // operand i's scale: row i
    Tensor all(DType::kFloat32, Shape{4 * n * kSlot});
    world()->all_gather(states.scale(), all);
    const float* s = all.data_as<float>();
    for (int i = 0; i < n; ++i) {
      // kMax over the window of the last 8 steps of the global max; margin 1.
      double window = 0.0;
      for (int step = kSteps - 8; step < kSteps; ++step)
        for (int r = 0; r < 4; ++r) window = std::max(window, double(local_amax(r, i, step, n)));
      const double fp8 = i % 3 == 2 ? 57344.0 : 448.0;
      const auto expected = static_cast<float>(window > 0 ? fp8 / window / 2.0 : 1.0);
      for (int r = 0; r < 4; ++r)
        ASSERT_EQ(s[(r * n + i) * kSlot], expected)
            << "rank " << r << " operand " << i << " of " << n;
    }
  }
}

TEST(AmaxReducerMpi, MeshGroupSpansDpAndTp) {
  Mesh mesh(world(), {{"dp", 2}, {"tp", 2}});
  const AmaxReducer reducer(mesh);
  EXPECT_EQ(reducer.group()->size(), 4);
  ScalingStates states(DelayedScaling{}, {OperandRole::kWeight});
  states.current_amax().data_as<float>()[0] = float(1 + world()->rank());
  reducer.reduce_and_update(states);
  EXPECT_EQ(states.scale().data_as<float>()[0], 448.0f / 4.0f);
}

}  // namespace
}  // namespace qmesh
