// GatheredInput::kRegather: column-parallel, sequence-parallel layers that keep only their
// input chunk and gather it again in backward (alongside dgrad) give the same bits as layers
// that keep the gathered input. Two layers with different inputs share the context's gather
// buffer, so a layer that used what the other left there would get the wrong weight gradient.
#include <gtest/gtest.h>

#include <vector>

#include "qmesh/comm/local.h"
#include "qmesh/layers/dense.h"
#include "qmesh/random.h"

namespace qmesh {
namespace {

struct Case {
  int tp;
  Recipe recipe;
  Overlap overlap;
};

// Every output and gradient of one rank, as raw floats.
using RankResult = std::vector<std::vector<float>>;

std::vector<float> values(const TensorView& t) {
  const float* p = t.data_as<float>();
  return std::vector<float>(p, p + t.numel());
}

Tensor sample(uint64_t seed, int64_t rows, int64_t cols) {
  Tensor t(DType::kFloat32, Shape{rows, cols});
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = counter_normal(seed, uint64_t(i));
  return t;
}

std::vector<RankResult> run(const Case& c, GatheredInput gathered) {
  constexpr int64_t kIn = 16, kOut = 24, kChunk = 4;  // tokens per rank
  std::vector<RankResult> out(size_t(c.tp));
  run_local_ranks(c.tp, [&](Communicator& comm) {
    Mesh mesh(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}),
              {{"dp", 1}, {"tp", c.tp}});
    LayerContext ctx(mesh, c.recipe);
    const DenseOptions options{DenseParallelism::kColumn, true,      true,
                               DenseActivation::kNone,    c.overlap, gathered};
    Dense first("first", kIn, kOut, options, ctx, 11),
        second("second", kIn, kOut, options, ctx, 12);
    const uint64_t r = uint64_t(comm.rank());
    const Tensor x1 = sample(100 + r, kChunk, kIn), x2 = sample(200 + r, kChunk, kIn);
    const Tensor dy = sample(300, kChunk * c.tp, kOut / c.tp);
    RankResult& result = out[comm.rank()];
    result.push_back(values(first.forward(x1)));
    result.push_back(values(second.forward(x2)));  // the shared buffer now holds x2's gather
    result.push_back(values(second.backward(dy)));
    result.push_back(values(first.backward(dy)));
    for (Dense* d : {&first, &second})
      for (Parameter* p : d->parameters()) result.push_back(values(p->grad));
  });
  return out;
}

class GatheredInputTest : public testing::TestWithParam<Case> {};

TEST_P(GatheredInputTest, RegatherGivesTheSameBitsAsSave) {
  const auto saved = run(GetParam(), GatheredInput::kSave);
  const auto regathered = run(GetParam(), GatheredInput::kRegather);
  for (size_t rank = 0; rank < saved.size(); ++rank) {
    ASSERT_EQ(saved[rank].size(), regathered[rank].size());
    for (size_t i = 0; i < saved[rank].size(); ++i)
      EXPECT_EQ(saved[rank][i], regathered[rank][i])
          << "rank " << rank << ", tensor " << i << " (y1, y2, dx2, dx1, dW1, db1, dW2, db2)";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, GatheredInputTest,
                         testing::Values(Case{2, Recipe::kFp32, Overlap::kNone},
                                         Case{3, Recipe::kBf16, Overlap::kRing},
                                         Case{2, Recipe::kFp8Delayed, Overlap::kRing},
                                         Case{4, Recipe::kFp8Current, Overlap::kBidirectional}),
                         [](const auto& p) {
                           return detail::concat("tp", p.param.tp, "_", recipe_name(p.param.recipe),
                                                 "_", overlap_name(p.param.overlap));
                         });

}  // namespace
}  // namespace qmesh
