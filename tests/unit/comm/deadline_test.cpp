#include "qmesh/comm/deadline.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace qmesh {
namespace {

using std::chrono::milliseconds;

TEST(Deadline, FarDeadlineHasNotPassedAndLeavesAtMostItsTimeout) {
  const auto before = Deadline::Clock::now();
  const Deadline deadline(milliseconds(60000));
  const auto after = Deadline::Clock::now();
  EXPECT_FALSE(deadline.passed());
  EXPECT_GE(deadline.at(), before + milliseconds(60000));
  EXPECT_LE(deadline.at(), after + milliseconds(60000));
  // Rounded up to whole milliseconds: never more than the timeout, and little less of it.
  EXPECT_LE(deadline.left(), milliseconds(60000));
  EXPECT_GE(deadline.left(), milliseconds(59000));
}

TEST(Deadline, LeftShrinksAsTimePasses) {
  const Deadline deadline(milliseconds(60000));
  const milliseconds first = deadline.left();
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_LE(deadline.left(), first - milliseconds(20));
}

TEST(Deadline, PassedDeadlineLeavesZeroNeverNegative) {
  const Deadline deadline(milliseconds(5));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_TRUE(deadline.passed());
  EXPECT_EQ(deadline.left(), milliseconds(0));
}

TEST(Deadline, ZeroOrNegativeTimeoutHasPassedAtOnce) {
  EXPECT_TRUE(Deadline(milliseconds(0)).passed());
  EXPECT_EQ(Deadline(milliseconds(0)).left(), milliseconds(0));
  EXPECT_TRUE(Deadline(milliseconds(-100)).passed());
  EXPECT_EQ(Deadline(milliseconds(-100)).left(), milliseconds(0));
}

}  // namespace
}  // namespace qmesh
