// The Work base class on its own: its state machine (a failure is final and rethrown by every
// later test() and wait()), the wording of timeout errors, which timeout wait() uses, and the
// destructor policy, through a scripted subclass whose hooks record their calls; and
// CompositeWork over such works (its stages, its parts' errors, one deadline, dropping).
#include "qmesh/comm/work.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>

#include "expect_error.h"
#include "qmesh/comm/composite_work.h"
#include "qmesh/error.h"

namespace qmesh {
namespace {

using std::chrono::milliseconds;

// What a ScriptedWork does and what was asked of it.
struct Script {
  int complete_after_polls = -1;      // poll() returns true from this call on; -1: never
  bool fail_on_poll = false;          // poll() throws "scripted failure"
  bool completes_at_timeout = false;  // on_timeout() finds it complete
  bool withdrawable = false;          // withdraw() succeeds
  int polls = 0, timeouts = 0, withdrawals = 0;
};

class ScriptedWork : public Work {
 public:
  ScriptedWork(Script& script, milliseconds timeout,
               TimeoutSource source = TimeoutSource::kEnvironment)
      : Work("scripted op (rank 0 of 2)", timeout, source), script_(script) {}
  ~ScriptedWork() override { drop_unfinished(); }

 protected:
  bool poll() override {
    ++script_.polls;
    if (script_.fail_on_poll) QMESH_THROW("scripted failure");
    return script_.complete_after_polls >= 0 && script_.polls >= script_.complete_after_polls;
  }
  std::optional<std::string> on_timeout(milliseconds) override {
    ++script_.timeouts;
    if (script_.completes_at_timeout) return std::nullopt;
    return "peer rank 1 never came";
  }
  bool withdraw() override {
    ++script_.withdrawals;
    return script_.withdrawable;
  }

 private:
  Script& script_;
};

TEST(Work, CompletesOnceAndStaysComplete) {
  Script script;
  script.complete_after_polls = 3;
  ScriptedWork work(script, milliseconds(5000));
  EXPECT_FALSE(work.test());
  EXPECT_FALSE(work.test());
  EXPECT_TRUE(work.test());
  EXPECT_TRUE(work.test());
  work.wait();
  EXPECT_EQ(script.polls, 3);  // no hook runs once it has completed
  EXPECT_EQ(script.timeouts, 0);
}

TEST(Work, AFailureIsRethrownByEveryLaterCall) {
  Script script;
  script.fail_on_poll = true;
  ScriptedWork work(script, milliseconds(5000));
  EXPECT_QMESH_ERROR(work.test(), "scripted failure");
  EXPECT_QMESH_ERROR(work.test(), "scripted failure");
  EXPECT_QMESH_ERROR(work.wait(), "scripted failure");
  EXPECT_QMESH_ERROR(work.wait(milliseconds(0)), "scripted failure");
  EXPECT_EQ(script.polls, 1);
}

TEST(Work, TimeoutErrorNamesTheOperationTheLimitAndThePeer) {
  Script script;
  ScriptedWork work(script, milliseconds(5000));
  EXPECT_QMESH_ERROR(work.wait(milliseconds(30)),
                     "scripted op (rank 0 of 2) timed out after 0.03 s (QMESH_COMM_TIMEOUT_S): "
                     "peer rank 1 never came");
  EXPECT_EQ(script.timeouts, 1);
  // The timeout is final: later calls rethrow it without polling or timing out again.
  const int polls = script.polls;
  EXPECT_QMESH_ERROR(work.test(), "timed out after 0.03 s");
  EXPECT_QMESH_ERROR(work.wait(), "timed out after 0.03 s");
  EXPECT_EQ(script.polls, polls);
  EXPECT_EQ(script.timeouts, 1);
}

TEST(Work, ATimeoutIsAnErrorOfKindTimeoutAndAnOperationsErrorKeepsItsKind) {
  Script script;
  ScriptedWork work(script, milliseconds(10));
  try {
    work.wait();
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kTimeout);
  }
  Script failing;
  failing.fail_on_poll = true;
  ScriptedWork failed(failing, milliseconds(5000));
  try {
    failed.wait();
    ADD_FAILURE() << "nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);  // QMESH_THROW's
  }
}

TEST(Work, ATimeoutSetInCodeIsNamedAsSuch) {
  Script script;
  ScriptedWork work(script, milliseconds(5000), TimeoutSource::kCommunicator);
  EXPECT_QMESH_ERROR(work.wait(milliseconds(20)),
                     "timed out after 0.02 s (the communicator's timeout): peer rank 1");
}

// wait() takes the operation's own timeout (its communicator's when it was issued), not the
// environment variable's 300 s: with the variable, this test would wait for five minutes.
TEST(Work, WaitWithoutArgumentUsesTheOperationsTimeout) {
  setenv("QMESH_COMM_TIMEOUT_S", "300", 1);
  Script script;
  ScriptedWork work(script, milliseconds(40), TimeoutSource::kCommunicator);
  EXPECT_EQ(work.timeout(), milliseconds(40));
  EXPECT_EQ(work.timeout_source(), TimeoutSource::kCommunicator);
  EXPECT_QMESH_ERROR(work.wait(), "timed out after 0.04 s (the communicator's timeout)");
  unsetenv("QMESH_COMM_TIMEOUT_S");
}

TEST(Work, AnOperationFoundCompleteAtItsTimeoutSucceeds) {
  Script script;
  script.completes_at_timeout = true;
  ScriptedWork work(script, milliseconds(5000));
  work.wait(milliseconds(10));
  EXPECT_TRUE(work.test());
  EXPECT_EQ(script.timeouts, 1);
}

TEST(Work, DroppingAWithdrawableOperationDoesNotWait) {
  Script script;
  script.withdrawable = true;
  { ScriptedWork work(script, milliseconds(5000)); }
  EXPECT_EQ(script.withdrawals, 1);
  EXPECT_EQ(script.timeouts, 0);
}

TEST(Work, DroppingAnOperationThatCannotBeWithdrawnWaitsForItWithoutThrowing) {
  Script script;
  { ScriptedWork work(script, milliseconds(20)); }  // times out: logged, not thrown
  EXPECT_EQ(script.withdrawals, 1);
  EXPECT_EQ(script.timeouts, 1);
  Script completes;
  completes.complete_after_polls = 4;
  { ScriptedWork work(completes, milliseconds(5000)); }
  EXPECT_EQ(completes.polls, 4);
  EXPECT_EQ(completes.timeouts, 0);
}

TEST(Work, DroppingAFinishedOrFailedOperationDoesNothing) {
  Script done;
  done.complete_after_polls = 1;
  {
    ScriptedWork work(done, milliseconds(5000));
    EXPECT_TRUE(work.test());
  }
  Script timed_out;
  {
    ScriptedWork work(timed_out, milliseconds(5000));
    EXPECT_QMESH_ERROR(work.wait(milliseconds(10)), "timed out");
  }
  EXPECT_EQ(done.withdrawals, 0);
  EXPECT_EQ(timed_out.withdrawals, 0);
  EXPECT_EQ(timed_out.timeouts, 1);  // the wait's own, not a second one when dropped
}

// ---- CompositeWork ----

// Two stages: `first` completes after two polls; its next stage adds `second`.
class TwoStageWork : public CompositeWork {
 public:
  TwoStageWork(Script& first, Script& second, milliseconds timeout)
      : CompositeWork("two-stage op (rank 0 of 2)", timeout, TimeoutSource::kEnvironment),
        second_(second) {
    add(std::make_unique<ScriptedWork>(first, timeout));
    add(nullptr);  // an operation with nothing to wait for
  }
  int stages = 0;

 protected:
  void next_stage() override {
    if (++stages == 1) add(std::make_unique<ScriptedWork>(second_, timeout()));
  }

 private:
  Script& second_;
};

TEST(CompositeWork, RunsItsStagesInTurnAndCompletesWhenOneAddsNoParts) {
  Script first, second;
  first.complete_after_polls = 2;
  second.complete_after_polls = 2;
  TwoStageWork work(first, second, milliseconds(5000));
  EXPECT_FALSE(work.test());  // first: poll 1
  EXPECT_EQ(work.stages, 0);
  EXPECT_FALSE(work.test());  // first completes; the second stage starts, its poll 1
  EXPECT_EQ(work.stages, 1);
  EXPECT_EQ(second.polls, 1);
  EXPECT_TRUE(work.test());  // second completes; the next stage adds nothing
  EXPECT_EQ(work.stages, 2);
  work.wait();
  EXPECT_EQ(first.polls, 2);
  EXPECT_EQ(second.polls, 2);
}

TEST(CompositeWork, APartsErrorIsTheCompositesAndPartsWaitForItsDeadline) {
  Script first, second;
  first.fail_on_poll = true;
  TwoStageWork failing(first, second, milliseconds(5000));
  EXPECT_QMESH_ERROR(failing.wait(), "scripted failure");
  EXPECT_QMESH_ERROR(failing.test(), "scripted failure");
  EXPECT_EQ(failing.stages, 0);

  Script quick, never;
  quick.complete_after_polls = 1;
  TwoStageWork stuck(quick, never, milliseconds(5000));
  EXPECT_QMESH_ERROR(stuck.wait(milliseconds(30)),
                     "scripted op (rank 0 of 2) timed out after 0.0");  // what was left of 30 ms
  EXPECT_EQ(never.timeouts, 1);
}

TEST(CompositeWork, WithoutPartsItIsCompleteAtOnce) {
  CompositeWork work("nothing (rank 0 of 1)", milliseconds(5000), TimeoutSource::kEnvironment);
  EXPECT_TRUE(work.test());
}

TEST(CompositeWork, DroppingItDropsItsUnfinishedPartsAndNeverTheirStages) {
  Script first, second;
  first.withdrawable = true;
  {
    TwoStageWork work(first, second, milliseconds(5000));
    EXPECT_FALSE(work.test());
  }
  EXPECT_EQ(first.withdrawals, 1);  // dropped by its own policy: withdrawn, not waited for
  EXPECT_EQ(first.timeouts, 0);
  EXPECT_EQ(second.polls, 0);  // the next stage never starts
}

}  // namespace
}  // namespace qmesh
