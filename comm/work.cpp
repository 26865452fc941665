#include "qmesh/comm/work.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "qmesh/comm/communicator.h"
#include "qmesh/comm/reduce_op.h"
#include "qmesh/error.h"
#include "qmesh/logging.h"
#include "qmesh/param.h"
#include "timeout_text.h"

namespace qmesh {

std::chrono::milliseconds comm_timeout() {
  constexpr double kDefaultSeconds = 300.0;
  // About 3 years: beyond, the milliseconds and the clock's deadlines would overflow.
  constexpr int64_t kMaxSeconds = 100'000'000;
  const double seconds = param_double("COMM_TIMEOUT_S", kDefaultSeconds);
  QMESH_CHECK(std::isfinite(seconds) && seconds > 0 && seconds <= double(kMaxSeconds),
              "QMESH_COMM_TIMEOUT_S=", seconds, " must be a positive number of seconds, at most ",
              kMaxSeconds, " (default ", kDefaultSeconds, ")");
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

namespace comm_detail {
std::string_view timeout_name(TimeoutSource source) {
  return source == TimeoutSource::kCommunicator ? "the communicator's timeout"
                                                : "QMESH_COMM_TIMEOUT_S";
}

std::string slow_job_hint(TimeoutSource source) {
  return detail::concat(" (raise ", timeout_name(source), " if the job is only slow)");
}

std::string timeout_text(std::string_view what, std::chrono::milliseconds limit,
                         TimeoutSource source) {
  return detail::concat(what, " timed out after ", std::chrono::duration<double>(limit).count(),
                        " s (", timeout_name(source), ")");
}

namespace {
std::string rank_list(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}
}  // namespace

std::string peer_ranks(const std::vector<int>& ranks, const WorldRanks& world) {
  std::string out = (ranks.size() == 1 ? "peer rank " : "peer ranks ") + rank_list(ranks);
  if (world.empty() || ranks.empty()) return out;
  std::vector<int> in_world;
  for (int r : ranks) in_world.push_back(world.at(static_cast<size_t>(r)));
  return out + (ranks.size() == 1 ? " (world rank " : " (world ranks ") + rank_list(in_world) + ")";
}

std::string never_joined_text(const std::vector<int>& ranks, std::string_view op,
                              const WorldRanks& world) {
  return detail::concat(peer_ranks(ranks, world), " never joined this ", op);
}

std::string ring_wait_text(bool receiving, int peer, std::string_view where,
                           std::chrono::milliseconds waited, const WorldRanks& world) {
  const double seconds = std::chrono::duration<double>(waited).count();
  const std::string who = peer_ranks({peer}, world);
  return receiving ? detail::concat("waited ", seconds, " s for data from ", who, " in ", where,
                                    "; that rank died, froze, or is itself waiting for another")
                   : detail::concat("waited ", seconds, " s for ", who, " to take data in ", where,
                                    "; that rank died, froze, or is itself waiting for another");
}

std::string p2p_wait_text(bool receiving, int peer, int tag, const WorldRanks& world) {
  const std::string who = peer_ranks({peer}, world);
  return receiving ? detail::concat(who, " sent nothing with tag ", tag,
                                    " (it died, froze, or has not reached the matching send)")
                   : detail::concat(who, " did not take the message with tag ", tag,
                                    " (it died, froze, or has not reached the matching receive)");
}

std::string roll_call_text(const std::vector<int>& ranks, std::string_view op,
                           const WorldRanks& world) {
  if (ranks.empty()) {
    return detail::concat("every peer rank answered the roll call that follows a timeout, so all ",
                          "are alive: one is waiting in another operation than this ", op);
  }
  return detail::concat(peer_ranks(ranks, world),
                        " did not answer the roll call that follows a timeout: dead, frozen, ",
                        "or never joined this ", op);
}

std::string unnamed_peer_text(std::string_view op) {
  return detail::concat("MPI cannot name the peer rank this ", op,
                        " waits for in a job on several hosts: a rank died, froze, or never "
                        "joined it");
}
}  // namespace comm_detail

Work::Work(std::string what, std::chrono::milliseconds timeout, TimeoutSource source)
    : what_(std::move(what)), timeout_(timeout), source_(source) {}

Work::Work(std::string what, const Communicator& issuer)
    : Work(std::move(what), issuer.timeout(), issuer.timeout_source()) {}

Work::~Work() = default;

void Work::fail(std::exception_ptr error) {
  error_ = error;
  done_ = true;
  std::rethrow_exception(error);
}

bool Work::test() {
  if (error_) std::rethrow_exception(error_);
  if (done_) return true;
  try {
    done_ = poll();
  } catch (...) {
    fail(std::current_exception());
  }
  return done_;
}

void Work::wait(std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  if (test()) return;
  std::optional<std::string> blame;
  try {
    if (block_until(deadline)) {
      done_ = true;
      return;
    }
    blame = on_timeout(timeout);
    if (!blame) {
      done_ = true;  // it completed after all
      return;
    }
    QMESH_THROW_KIND(ErrorKind::kTimeout, timeout_text(timeout), ": ", *blame);
  } catch (...) {
    fail(std::current_exception());
  }
}

void Work::wait() { wait(timeout_); }

bool Work::block_until(const Deadline& deadline) {
  // Yield while the wait is young (latency); sleep once it is long (oversubscribed nodes).
  const auto patient = Clock::now() + std::chrono::milliseconds(20);
  while (!poll()) {
    if (deadline.passed()) return false;
    if (Clock::now() < patient) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
  return true;
}

std::optional<std::string> Work::on_timeout(std::chrono::milliseconds) {
  return "a peer rank may have failed or not issued the matching call" +
         comm_detail::slow_job_hint(source_);
}

void Work::drop_unfinished() noexcept {
  if (done_) return;
  try {
    if (withdraw()) {
      done_ = true;
      return;
    }
    wait();
  } catch (const std::exception& e) {
    QMESH_LOG_ERROR("unfinished ", what_, " dropped: ", e.what());
  }
}

std::string Work::timeout_text(std::chrono::milliseconds timeout) const {
  return comm_detail::timeout_text(what_, timeout, source_);
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  QMESH_THROW("invalid ReduceOp value ", static_cast<int>(op));
}

}  // namespace qmesh
