// The rank-ordered reductions against their definition, every element summed over the ranks
// in rank order in float, on the local backend; bad input is a clear error.
#include "qmesh/comm/ordered_reduce.h"

#include <gtest/gtest.h>

#include "expect_error.h"
#include "qmesh/comm/local.h"
#include "qmesh/random.h"

namespace qmesh {
namespace {

float value_of(int rank, int64_t i) { return counter_normal(uint64_t(rank) + 11, uint64_t(i)); }

// The definition: every element summed in rank order, ((x0 + x1) + x2) + ..., in float.
float rank_order_sum(int ranks, int64_t i) {
  float sum = value_of(0, i);
  for (int r = 1; r < ranks; ++r) sum += value_of(r, i);
  return sum;
}

TEST(OrderedReduce, ReduceScatterAndAllReduceSumInRankOrder) {
  const int n = 4;
  for (int64_t total : {int64_t(3), int64_t(4), int64_t(37), int64_t(400)}) {
    run_local_ranks(n, [&](Communicator& comm) {
      Tensor buf(DType::kFloat32, Shape{total});
      for (int64_t i = 0; i < total; ++i) buf.data_as<float>()[i] = value_of(comm.rank(), i);
      if (total % n == 0) {
        Tensor out(DType::kFloat32, Shape{total / n});
        ordered_reduce_scatter(comm, buf, out);
        for (int64_t i = 0; i < total / n; ++i)
          ASSERT_EQ(out.data_as<float>()[i], rank_order_sum(n, comm.rank() * (total / n) + i));
      }
      ordered_all_reduce(comm, buf);
      for (int64_t i = 0; i < total; ++i)
        ASSERT_EQ(buf.data_as<float>()[i], rank_order_sum(n, i)) << "total " << total;
    });
  }
}

TEST(OrderedReduce, BadInputIsAClearError) {
  run_local_ranks(2, [&](Communicator& comm) {
    Tensor in(DType::kFloat32, Shape{6}), out(DType::kFloat32, Shape{2});
    EXPECT_QMESH_ERROR(ordered_reduce_scatter(comm, in, out), "");
    Tensor bf(DType::kBFloat16, Shape{4});
    EXPECT_QMESH_ERROR(ordered_all_reduce(comm, bf), "");
  });
}

}  // namespace
}  // namespace qmesh
