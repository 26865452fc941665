// The global amax reduction on the local (threads) backend: 4 ranks as dp x tp = 2 x 2 end up
// with identical scales equal to a float64 reference from the global max, pipeline stages
// keep their own scales, and a counting communicator proves one collective per reduction.
#include "qmesh/scaling/amax_reducer.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <mutex>
#include <vector>

#include "counting_communicator.h"
#include "expect_error.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/mesh.h"
#include "qmesh/fp8.h"
#include "qmesh/logging.h"

namespace qmesh {
namespace {

const std::vector<OperandRole> kRoles = {OperandRole::kInput, OperandRole::kWeight,
                                         OperandRole::kGradOutput, OperandRole::kInput,
                                         OperandRole::kGradOutput};

// Rank r's local amax of operand i at step s: different on every rank; operand 3 runs only
// on rank 1; operand 4 never runs (its module is skipped: amax 0 everywhere).
float local_amax(int rank, int i, int step) {
  if (i == 4 || (i == 3 && rank != 1)) return 0.0f;
  return std::ldexp(1.0f + 0.25f * float((rank * 7 + i * 3 + step) % 5), (rank + i + step) % 9 - 4);
}

std::shared_ptr<Communicator> borrow(Communicator& comm) {
  return {&comm, [](Communicator*) {}};
}

TEST(AmaxReducer, DpTimesTpRanksAgreeOnScalesFromTheGlobalMax) {
  constexpr int kRanks = 4, kSteps = 6;
  std::vector<std::vector<float>> scales(kRanks);
  std::mutex mu;
  run_local_ranks(kRanks, [&](Communicator& world) {
    Mesh mesh(borrow(world), {{"dp", 2}, {"tp", 2}});
    const AmaxReducer reducer(mesh);
    ASSERT_EQ(reducer.group()->size(), kRanks);
    DelayedScaling recipe;
    recipe.amax_history_len = 4;
    ScalingStates states(recipe, kRoles);
    for (int step = 0; step < kSteps; ++step) {
      float* amax = states.current_amax().data_as<float>();
      for (int i = 0; i < states.size(); ++i) amax[i] = local_amax(world.rank(), i, step);
      reducer.reduce_and_update(states);
    }
    const float* s = states.scale().data_as<float>();
    std::lock_guard<std::mutex> lock(mu);
    for (int i = 0; i < states.size(); ++i)
      scales[world.rank()].push_back(s[i * QuantizedTensor::kScalarSlot]);
  });
  // Reference: the max algorithm over the global max of each of the last 4 steps.
  for (int i = 0; i < int(kRoles.size()); ++i) {
    double window = 0.0;
    for (int step = kSteps - 4; step < kSteps; ++step)
      for (int r = 0; r < kRanks; ++r) window = std::max(window, double(local_amax(r, i, step)));
    const double fp8 = i == 2 || i == 4 ? 57344.0 : 448.0;
    const double expected = window > 0 ? fp8 / window : 1.0;  // operand 4 never ran
    for (int r = 0; r < kRanks; ++r)
      EXPECT_EQ(scales[r][i], static_cast<float>(expected)) << "rank " << r << " operand " << i;
  }
}

TEST(AmaxReducer, PipelineStagesKeepTheirOwnScales) {
  constexpr int kRanks = 4;
  std::vector<float> scale(kRanks);
  run_local_ranks(kRanks, [&](Communicator& world) {
    MeshResource roles;
    roles.pp = "pp";
    Mesh mesh(borrow(world), {{"pp", 2}, {"dp", 2}}, roles);
    const AmaxReducer reducer(mesh);
    ASSERT_EQ(reducer.group()->size(), 2);
    ScalingStates states(DelayedScaling{}, {OperandRole::kInput});
    states.current_amax().data_as<float>()[0] = float(1 + world.rank());  // 1, 2 | 3, 4
    reducer.reduce_and_update(states);
    scale[world.rank()] = states.scale().data_as<float>()[0];
  });
  EXPECT_EQ(scale[0], 448.0f / 2.0f);
  EXPECT_EQ(scale[1], 448.0f / 2.0f);
  EXPECT_EQ(scale[2], 448.0f / 4.0f);
  EXPECT_EQ(scale[3], 448.0f / 4.0f);
}

TEST(AmaxReducer, OneCollectivePerReductionWhateverTheNumberOfTensors) {
  for (int tensors : {1, 10, 1000}) {
    run_local_ranks(4, [&](Communicator& world) {
      auto counting = std::make_shared<testing::CountingCommunicator>(borrow(world));
      const AmaxReducer reducer = AmaxReducer::with_group_override(counting);
      DelayedScaling recipe;
      recipe.amax_history_len = 16;
      ScalingStates states(recipe, std::vector<OperandRole>(tensors, OperandRole::kWeight));
      for (int step = 1; step <= 3; ++step) {
        float* amax = states.current_amax().data_as<float>();
        for (int i = 0; i < tensors; ++i) amax[i] = float(world.rank() + i + 1);
        reducer.reduce_and_update(states);
        ASSERT_EQ(counting->collectives(), step) << tensors << " tensors";
        ASSERT_EQ(counting->all_reduces(), step);
        const float* s = states.scale().data_as<float>();
        for (int i = 0; i < tensors; ++i)
          ASSERT_EQ(s[i * QuantizedTensor::kScalarSlot],
                    static_cast<float>(448.0 / double(3 + i + 1)));
      }
    });
  }
}

TEST(AmaxReducer, OverrideWarnsAndNullIsAnError) {
  auto world = make_local_world(1);
  set_log_level(LogLevel::kWarn);
  ::testing::internal::CaptureStderr();
  const AmaxReducer reducer = AmaxReducer::with_group_override(world[0]);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("amax reduction group overridden"), std::string::npos) << log;
  EXPECT_EQ(reducer.group(), world[0]);
  EXPECT_QMESH_ERROR(AmaxReducer::with_group_override(nullptr), "needs a communicator");
}

}  // namespace
}  // namespace qmesh
