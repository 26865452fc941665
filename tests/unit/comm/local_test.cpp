// The local (threads) backend: every collective for 1..8 ranks against float64 references,
// point-to-point matching, split, argument errors, timeouts and aborts.
#include "qmesh/comm/local.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "collective_suite.h"
#include "expect_error.h"

namespace qmesh {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Sets QMESH_COMM_TIMEOUT_S for one test.
class ScopedTimeout {
 public:
  explicit ScopedTimeout(const char* seconds) { setenv("QMESH_COMM_TIMEOUT_S", seconds, 1); }
  ~ScopedTimeout() { unsetenv("QMESH_COMM_TIMEOUT_S"); }
};

class LocalCollectives : public ::testing::TestWithParam<int> {};

TEST_P(LocalCollectives, MatchReferences) {
  ScopedTimeout timeout("60");  // a failing check must not leave peers waiting for minutes
  run_local_ranks(GetParam(), [](Communicator& comm) {
    EXPECT_EQ(comm.backend_name(), "local");
    EXPECT_FALSE(comm.stream_ordered());
    testing::run_collective_suite(comm);
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, LocalCollectives, ::testing::Range(1, 9));

TEST(Local, BarrierWaitsForEveryRank) {
  std::atomic<int> entered{0};
  run_local_ranks(5, [&](Communicator& comm) {
    for (int round = 1; round <= 3; ++round) {
      ++entered;
      comm.barrier();
      EXPECT_GE(entered.load(), 5 * round);
      comm.barrier();  // nobody starts the next round before everyone has checked
    }
  });
}

TEST(Local, Bf16SumRoundsOncePerStep) {
  // A buffer smaller than the world is reduced in rank order. 1 + 2^-8 lies halfway between
  // the bf16 values 1 and 1 + 2^-7 and rounds to even (1), so adding 2^-8 three times to 1
  // stays at 1; a single fp32 sum would give 1 + 3 * 2^-8, which rounds to 1 + 2^-6.
  run_local_ranks(4, [](Communicator& comm) {
    uint16_t v = float_to_bf16(comm.rank() == 0 ? 1.0f : 1.0f / 256);
    comm.all_reduce(TensorView(&v, DType::kBFloat16, Shape{1}), ReduceOp::kSum);
    EXPECT_EQ(bf16_to_float(v), 1.0f);
  });
}

TEST(Local, MaxAndMinPropagateNaN) {
  run_local_ranks(3, [](Communicator& comm) {
    for (ReduceOp op : {ReduceOp::kMax, ReduceOp::kMin}) {
      float v[4] = {1.0f, 2.0f, 3.0f, 4.0f};
      if (comm.rank() == 1) v[2] = std::numeric_limits<float>::quiet_NaN();
      comm.all_reduce(TensorView(v, DType::kFloat32, Shape{4}), op);
      EXPECT_TRUE(std::isnan(v[2])) << reduce_op_name(op);
      EXPECT_EQ(v[0], 1.0f);
    }
  });
}

TEST(Local, SplitGroupsAreIndependentOfTheParent) {
  run_local_ranks(6, [](Communicator& comm) {
    auto rows = comm.split(comm.rank() / 3, comm.rank());
    auto cols = comm.split(comm.rank() % 3, comm.rank());
    ASSERT_EQ(rows->size(), 3);
    ASSERT_EQ(cols->size(), 2);
    int32_t a = comm.rank(), b = comm.rank();
    WorkHandle wa = rows->all_reduce_async(TensorView(&a, DType::kInt32, Shape{1}), ReduceOp::kSum);
    WorkHandle wb = cols->all_reduce_async(TensorView(&b, DType::kInt32, Shape{1}), ReduceOp::kMax);
    wa->wait();
    wb->wait();
    EXPECT_EQ(a, comm.rank() < 3 ? 0 + 1 + 2 : 3 + 4 + 5);
    EXPECT_EQ(b, comm.rank() % 3 + 3);
    auto nested = rows->split(0, -rows->rank());
    EXPECT_EQ(nested->rank(), 2 - rows->rank());
  });
}

TEST(Local, HostIdsAreOneHost) {
  run_local_ranks(3,
                  [](Communicator& comm) { EXPECT_EQ(comm.host_ids(), std::vector<int>(3, 0)); });
}

TEST(Local, BadArgumentsAreErrors) {
  auto comms = make_local_world(2);
  Communicator& c = *comms[0];
  float x[4] = {};
  TensorView four(x, DType::kFloat32, Shape{4});
  TensorView two(x, DType::kFloat32, Shape{2});
  uint8_t bytes[4] = {};
  TensorView fp8(bytes, DType::kFloat8E4M3, Shape{4});
  EXPECT_QMESH_ERROR(c.all_gather_async(four, two), "all_gather output has 2 elements");
  EXPECT_QMESH_ERROR(c.reduce_scatter_async(two, two, ReduceOp::kSum),
                     "reduce_scatter input has 2 elements");
  EXPECT_QMESH_ERROR(c.all_reduce_async(fp8, ReduceOp::kSum), "reductions support");
  EXPECT_QMESH_ERROR(c.all_reduce_async(TensorView(), ReduceOp::kSum), "all_reduce buffer");
  EXPECT_QMESH_ERROR(c.broadcast_async(four, 2), "broadcast root 2 is out of range [0, 2)");
  EXPECT_QMESH_ERROR(c.send_async(four, 5, 0), "send peer 5 is out of range");
  EXPECT_QMESH_ERROR(c.recv_async(four, 1, -1), "tag -1 is out of range");
  EXPECT_QMESH_ERROR(make_local_world(0), "local world size 0 must be >= 1");
}

TEST(Local, SizeMismatchFailsBothSides) {
  run_local_ranks(2, [](Communicator& comm) {
    float x[8] = {};
    if (comm.rank() == 0) {
      EXPECT_QMESH_ERROR(comm.send(TensorView(x, DType::kFloat32, Shape{4}), 1, 3),
                         "disagree on the size");
    } else {
      EXPECT_QMESH_ERROR(comm.recv(TensorView(x, DType::kFloat32, Shape{8}), 0, 3),
                         "disagree on the size");
    }
  });
}

TEST(Local, ReceiveWithoutSenderTimesOut) {
  ScopedTimeout timeout("0.3");
  auto comms = make_local_world(2);
  float x = 0;
  const auto start = Clock::now();
  EXPECT_QMESH_ERROR(comms[0]->recv(TensorView(&x, DType::kFloat32, Shape{1}), 1, 0),
                     "receive from rank 1 (rank 0 of 2) timed out");
  EXPECT_LT(seconds_since(start), 5.0);
  // An explicit timeout overrides the default.
  WorkHandle w = comms[1]->recv_async(TensorView(&x, DType::kFloat32, Shape{1}), 0, 0);
  EXPECT_FALSE(w->test());
  EXPECT_QMESH_ERROR(w->wait(std::chrono::milliseconds(50)), "timed out");
}

TEST(Local, CollectiveWithAMissingRankTimesOut) {
  ScopedTimeout timeout("0.3");
  const auto start = Clock::now();
  run_local_ranks(3, [](Communicator& comm) {
    if (comm.rank() == 2) return;  // never joins
    float x = 1;
    EXPECT_QMESH_ERROR(comm.all_reduce(TensorView(&x, DType::kFloat32, Shape{1}), ReduceOp::kSum),
                       "local all_reduce (rank");
  });
  EXPECT_LT(seconds_since(start), 5.0);
}

// One call of collective `op` on 4 ranks, 8 floats each (reduce-scatter: 2 per rank); a
// broadcast comes from `root`.
void call_collective(Communicator& comm, const std::string& op, int root) {
  std::vector<float> in(8, 1.0f), out(32, 0.0f);
  TensorView v(in.data(), DType::kFloat32, Shape{8});
  if (op == "all_reduce") comm.all_reduce(v, ReduceOp::kSum);
  if (op == "all_gather") comm.all_gather(v, TensorView(out.data(), DType::kFloat32, Shape{32}));
  if (op == "reduce_scatter")
    comm.reduce_scatter(v, TensorView(out.data(), DType::kFloat32, Shape{2}), ReduceOp::kSum);
  if (op == "broadcast") comm.broadcast(v, root);
  if (op == "barrier") comm.barrier();
  if (op == "split") comm.split(0, comm.rank());
}

// Ranks that skip a collective are named, exactly, by the timeout error of every rank that
// called it. (A broadcast root waits only for the next rank: the root is the rank before the
// first one missing, so that every caller waits.)
TEST(Local, TimeoutNamesTheRanksThatNeverJoined) {
  ScopedTimeout timeout("0.2");
  for (const std::string op :
       {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier", "split"}) {
    SCOPED_TRACE(op);
    run_local_ranks(4, [&](Communicator& comm) {
      if (comm.rank() == 2) return;
      EXPECT_QMESH_ERROR(call_collective(comm, op, 1), "peer rank 2 never joined this " + op);
    });
    run_local_ranks(4, [&](Communicator& comm) {
      if (comm.rank() == 1 || comm.rank() == 3) return;
      EXPECT_QMESH_ERROR(call_collective(comm, op, 0),
                         "peer ranks 1 and 3 never joined this " + op);
    });
  }
}

// On a communicator split from the world, errors name the peer by its rank there and in the
// world: of the odd world ranks {1, 3, 5}, world rank 5 (rank 2 there) never joins.
TEST(Local, SubCommunicatorTimeoutsNameWorldRanks) {
  ScopedTimeout timeout("0.2");
  for (const std::string op : {"all_reduce", "split", "send"}) {
    SCOPED_TRACE(op);
    run_local_ranks(6, [&](Communicator& world) {
      auto group = world.split(world.rank() % 2, world.rank());
      if (world.rank() % 2 == 0 || world.rank() == 5) return;
      if (op == "send") {
        float x = 0;
        EXPECT_QMESH_ERROR(group->send(TensorView(&x, DType::kFloat32, Shape{1}), 2, 7),
                           "peer rank 2 (world rank 5) did not take the message with tag 7");
      } else {
        EXPECT_QMESH_ERROR(call_collective(*group, op, 0),
                           "peer rank 2 (world rank 5) never joined this " + op);
      }
    });
  }
}

// Point-to-point timeouts name the peer and the tag.
TEST(Local, PointToPointTimeoutNamesThePeerAndTag) {
  ScopedTimeout timeout("0.2");
  run_local_ranks(3, [](Communicator& comm) {
    float x = 0;
    TensorView v(&x, DType::kFloat32, Shape{1});
    if (comm.rank() == 0)
      EXPECT_QMESH_ERROR(comm.recv(v, 2, 7), "peer rank 2 sent nothing with tag 7");
    if (comm.rank() == 1) {
      EXPECT_QMESH_ERROR(comm.send(v, 2, 9), "peer rank 2 did not take the message with tag 9");
    }
  });
}

TEST(Local, AFailingRankAbortsTheOthersAtOnce) {
  // The default timeout stays long: the abort, not the timeout, must release the others.
  const auto start = Clock::now();
  std::atomic<int> aborted{0};
  try {
    run_local_ranks(4, [&](Communicator& comm) {
      if (comm.rank() == 1) QMESH_THROW("injected failure");
      float x = 1;
      try {
        comm.all_reduce(TensorView(&x, DType::kFloat32, Shape{1}), ReduceOp::kSum);
      } catch (const Error& e) {
        if (std::string(e.what()).find("local world was aborted: rank 1 failed") !=
            std::string::npos)
          ++aborted;
        throw;
      }
    });
    ADD_FAILURE() << "run_local_ranks did not rethrow";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("injected failure"), std::string::npos) << e.what();
  }
  EXPECT_EQ(aborted.load(), 3);
  EXPECT_LT(seconds_since(start), 10.0);
}

TEST(Local, TimeoutVariableIsValidated) {
  ScopedTimeout timeout("0");
  EXPECT_QMESH_ERROR(comm_timeout(), "QMESH_COMM_TIMEOUT_S=0 must be a positive number");
  setenv("QMESH_COMM_TIMEOUT_S", "soon", 1);
  EXPECT_QMESH_ERROR(comm_timeout(), "QMESH_COMM_TIMEOUT_S='soon' is not a number");
  setenv("QMESH_COMM_TIMEOUT_S", "1e99", 1);  // before: a negative, already expired timeout
  EXPECT_QMESH_ERROR(comm_timeout(), "at most 100000000");
  setenv("QMESH_COMM_TIMEOUT_S", "100000000", 1);
  EXPECT_EQ(comm_timeout(), std::chrono::seconds(100'000'000));
  setenv("QMESH_COMM_TIMEOUT_S", "2.5", 1);
  EXPECT_EQ(comm_timeout(), std::chrono::milliseconds(2500));
  unsetenv("QMESH_COMM_TIMEOUT_S");
  EXPECT_EQ(comm_timeout(), std::chrono::seconds(300));
}

// Expects `comm`'s timeout to be `limit`, set in code (not QMESH_COMM_TIMEOUT_S).
void expect_timeout_set(const Communicator& comm, std::chrono::milliseconds limit) {
  EXPECT_EQ(comm.timeout(), limit);
  EXPECT_EQ(comm.timeout_source(), TimeoutSource::kCommunicator);
}

// A communicator's timeout replaces QMESH_COMM_TIMEOUT_S (300 s here: were the setting
// ignored, these tests would wait five minutes, and the errors would name the variable).
TEST(Local, CommunicatorTimeoutBoundsItsOperations) {
  ScopedTimeout timeout("300");
  run_local_ranks(3, [](Communicator& comm) {
    EXPECT_EQ(comm.timeout(), std::chrono::seconds(300));
    EXPECT_EQ(comm.timeout_source(), TimeoutSource::kEnvironment);
    comm.set_timeout(std::chrono::milliseconds(200));
    expect_timeout_set(comm, std::chrono::milliseconds(200));
    if (comm.rank() == 2) return;  // never joins
    float x = 1;
    TensorView v(&x, DType::kFloat32, Shape{1});
    EXPECT_QMESH_ERROR(comm.all_reduce(v, ReduceOp::kSum),
                       "timed out after 0.2 s (the communicator's timeout): peer rank 2 never "
                       "joined this all_reduce");
    EXPECT_QMESH_ERROR(comm.split(0, 0),
                       "split (rank " + std::to_string(comm.rank()) +
                           " of 3) timed out after 0.2 s (the communicator's timeout): peer rank "
                           "2 never joined this split");
    if (comm.rank() == 0)
      EXPECT_QMESH_ERROR(comm.recv(v, 2, 4),
                         "timed out after 0.2 s (the communicator's timeout): peer rank 2 sent "
                         "nothing with tag 4");
  });
}

TEST(Local, SplitInheritsTheTimeout) {
  ScopedTimeout timeout("300");
  run_local_ranks(4, [](Communicator& comm) {
    comm.set_timeout(std::chrono::milliseconds(250));
    auto half = comm.split(comm.rank() % 2, comm.rank());
    expect_timeout_set(*half, std::chrono::milliseconds(250));
    // Without a setting the child follows the variable, as its parent does.
    comm.set_timeout(std::nullopt);
    EXPECT_EQ(comm.timeout(), std::chrono::seconds(300));
    auto unset = comm.split(0, comm.rank());
    EXPECT_EQ(unset->timeout_source(), TimeoutSource::kEnvironment);
    if (half->rank() == 1) return;  // never joins the half's barrier
    // Half (world ranks r, r + 2): its rank 1 is world rank r + 2.
    EXPECT_QMESH_ERROR(half->barrier(),
                       "barrier (rank 0 of 2) timed out after 0.25 s (the "
                       "communicator's timeout): peer rank 1 (world rank " +
                           std::to_string(comm.rank() + 2) + ") never joined this barrier");
  });
}

// An explicit wait(timeout) overrides the communicator's; the error still says where the
// communicator's own timeout is set. The Work keeps the timeout of the moment it was issued.
TEST(Local, WaitWithATimeoutOverridesTheCommunicators) {
  ScopedTimeout timeout("300");
  auto comms = make_local_world(2);
  comms[0]->set_timeout(std::chrono::seconds(200));
  float x = 0;
  WorkHandle w = comms[0]->recv_async(TensorView(&x, DType::kFloat32, Shape{1}), 1, 0);
  comms[0]->set_timeout(std::chrono::milliseconds(10));
  EXPECT_EQ(w->timeout(), std::chrono::seconds(200));
  EXPECT_QMESH_ERROR(w->wait(std::chrono::milliseconds(50)),
                     "timed out after 0.05 s (the communicator's timeout)");
}

TEST(Local, CommunicatorTimeoutMustBePositive) {
  auto comms = make_local_world(1);
  EXPECT_QMESH_ERROR(comms[0]->set_timeout(std::chrono::milliseconds(0)),
                     "communicator timeout of 0 ms: it must be positive");
  EXPECT_EQ(comms[0]->timeout_source(), TimeoutSource::kEnvironment);
}

TEST(Local, DeviceBuffersNeedCuda) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present: covered by tests/gpu";
  auto comms = make_local_world(1);
  float x = 0;
  TensorView fake_device(&x, DType::kFloat32, Shape{1}, Device::cuda(0));
  EXPECT_QMESH_ERROR(comms[0]->all_reduce(fake_device, ReduceOp::kSum), "cuda:0");
}

}  // namespace
}  // namespace qmesh
