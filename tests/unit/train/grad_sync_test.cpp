#include "qmesh/train/grad_sync.h"

#include <gtest/gtest.h>

#include "expect_error.h"
#include "qmesh/comm/local.h"

namespace qmesh {
namespace {

std::vector<Parameter> make_params(int rank) {
  std::vector<Parameter> ps;
  for (int i = 0; i < 5; ++i) {
    const int64_t n = 3 + 7 * i;
    Parameter p{detail::concat("p", i), Tensor(DType::kFloat32, Shape{n}),
                Tensor(DType::kFloat32, Shape{n})};
    for (int64_t j = 0; j < n; ++j) p.grad.data_as<float>()[j] = float(rank * 100 + i * 10 + j);
    ps.push_back(std::move(p));
  }
  return ps;
}

// Small buckets force several asynchronous reductions; the result must be the plain sum.
TEST(GradSync, SumsEveryGradientOverRanksInSeveralBuckets) {
  const int ranks = 3;
  run_local_ranks(ranks, [&](Communicator& comm) {
    auto params = make_params(comm.rank());
    std::vector<Parameter*> ptrs;
    for (auto& p : params) ptrs.push_back(&p);
    GradSync sync(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), ptrs, 64);
    EXPECT_GT(sync.bucket_count(), 2u);
    for (int step = 0; step < 2; ++step) {  // buckets are reusable across steps
      for (auto* p : ptrs) sync.ready({p});
      sync.finish();
      for (int i = 0; i < 5; ++i)
        for (int64_t j = 0; j < params[i].grad.numel(); ++j) {
          double want = 0;
          for (int r = 0; r < ranks; ++r) want += r * 100 + i * 10 + j;
          if (step == 1) want *= ranks;  // the second step sums the already-summed grads
          ASSERT_EQ(params[i].grad.data_as<float>()[j], float(want)) << i << "," << j;
        }
    }
  });
}

// GradSyncOrder::kRankOrder: every element summed over the ranks in rank order, in float.
TEST(GradSync, RankOrderSumsInRankOrder) {
  const int ranks = 4;
  auto value = [](int rank, int i, int64_t j) {
    return 1.0f / float(3 + rank * 7 + i * 5 + int(j));  // sums that depend on the order
  };
  run_local_ranks(ranks, [&](Communicator& comm) {
    auto params = make_params(comm.rank());
    std::vector<Parameter*> ptrs;
    for (auto& p : params) {
      for (int64_t j = 0; j < p.grad.numel(); ++j)
        p.grad.data_as<float>()[j] = value(comm.rank(), int(&p - params.data()), j);
      ptrs.push_back(&p);
    }
    GradSync sync(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}), ptrs, 64, {},
                  GradSyncOrder::kRankOrder);
    for (auto* p : ptrs) sync.ready({p});
    sync.finish();
    for (int i = 0; i < 5; ++i)
      for (int64_t j = 0; j < params[i].grad.numel(); ++j) {
        float want = value(0, i, j);
        for (int r = 1; r < ranks; ++r) want += value(r, i, j);
        ASSERT_EQ(params[i].grad.data_as<float>()[j], want) << i << "," << j;
      }
  });
}

TEST(GradSync, MisuseIsAClearError) {
  run_local_ranks(1, [&](Communicator& comm) {
    auto params = make_params(0);
    GradSync sync(std::shared_ptr<Communicator>(&comm, [](Communicator*) {}),
                  {&params[0], &params[1]});
    EXPECT_QMESH_ERROR(sync.ready({&params[2]}), "parameter p2 was not given to GradSync");
    sync.ready({&params[0]});
    EXPECT_QMESH_ERROR(sync.ready({&params[0]}), "marked ready twice");
    // p0 was marked, p1 (in the same bucket) was not: the message names p1.
    EXPECT_QMESH_ERROR(sync.finish(), "GradSync::finish: parameter p1 was never marked ready");
  });
}

}  // namespace
}  // namespace qmesh
