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
