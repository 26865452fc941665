// A point in time by which a wait must end, built from a timeout: what is left of it and
// whether it has passed. Operations that wait several times in turn (the steps of a ring, the
// buckets of a gradient reduction, the parts of a composite Work) share one Deadline, so that
// the whole operation, not each wait, is bounded by the timeout.
#pragma once

#include <algorithm>
#include <chrono>

namespace qmesh {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // `timeout` from now (the steady clock's now; a timeout <= 0 has passed at once).
  explicit Deadline(std::chrono::milliseconds timeout) : at_(Clock::now() + timeout) {}

  // What is left, rounded up to whole milliseconds; zero once passed. For a wait that takes
  // a timeout.
  std::chrono::milliseconds left() const {
    return std::max(std::chrono::ceil<std::chrono::milliseconds>(at_ - Clock::now()),
                    std::chrono::milliseconds(0));
  }

  // True once the deadline has been reached.
  bool passed() const { return Clock::now() >= at_; }

  // The time point itself, for waits that take one (std::condition_variable::wait_until).
  Clock::time_point at() const { return at_; }

 private:
  Clock::time_point at_;
};

}  // namespace qmesh
