#include "qmesh/comm/work.h"

#include <cmath>

#include "qmesh/comm/reduce_op.h"
#include "qmesh/error.h"
#include "qmesh/param.h"
#include "timeout_text.h"

namespace qmesh {

std::chrono::milliseconds comm_timeout() {
  constexpr double kDefaultSeconds = 300.0;
  const double seconds = param_double("COMM_TIMEOUT_S", kDefaultSeconds);
  QMESH_CHECK(std::isfinite(seconds) && seconds > 0, "QMESH_COMM_TIMEOUT_S=", seconds,
              " must be a positive number of seconds (default ", kDefaultSeconds, ")");
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000.0)));
}

namespace comm_detail {
std::string timeout_text(std::string_view what, std::chrono::milliseconds limit) {
  return detail::concat(what, " timed out after ", std::chrono::duration<double>(limit).count(),
                        " s (QMESH_COMM_TIMEOUT_S)");
}

std::string peer_ranks(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "peer rank " : "peer ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) out += i + 1 == ranks.size() ? " and " : ", ";
    out += std::to_string(ranks[i]);
  }
  return out;
}

std::string never_joined_text(const std::vector<int>& ranks, std::string_view op) {
  return detail::concat(peer_ranks(ranks), " never joined this ", op);
}

std::string ring_wait_text(bool receiving, int peer, std::string_view where,
                           std::chrono::milliseconds waited) {
  const double seconds = std::chrono::duration<double>(waited).count();
  const std::string who = peer_ranks({peer});
  return receiving ? detail::concat("waited ", seconds, " s for data from ", who, " in ", where,
                                    "; that rank died, froze, or is itself waiting for another")
                   : detail::concat("waited ", seconds, " s for ", who, " to take data in ", where,
                                    "; that rank died, froze, or is itself waiting for another");
}

std::string p2p_wait_text(bool receiving, int peer, int tag) {
  const std::string who = peer_ranks({peer});
  return receiving ? detail::concat(who, " sent nothing with tag ", tag,
                                    " (it died, froze, or has not reached the matching send)")
                   : detail::concat(who, " did not take the message with tag ", tag,
                                    " (it died, froze, or has not reached the matching receive)");
}

std::string roll_call_text(const std::vector<int>& ranks, std::string_view op) {
  if (ranks.empty()) {
    return detail::concat("every peer rank answered the roll call that follows a timeout, so all ",
                          "are alive: one is waiting in another operation than this ", op);
  }
  return detail::concat(peer_ranks(ranks),
                        " did not answer the roll call that follows a timeout: dead, frozen, ",
                        "or never joined this ", op);
}
}  // namespace comm_detail

Work::~Work() = default;

void Work::wait() { wait(comm_timeout()); }

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
