// A Communicator decorator that forwards every call to another communicator and counts the
// collectives issued through it (tests that prove how many collectives an algorithm uses).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "intercepting_communicator.h"

namespace qmesh::testing {

struct CallCounts {
  std::atomic<int> collectives{0};  // split and host_ids included
  std::atomic<int> all_reduces{0};
  std::atomic<int64_t> all_gather_bytes{0};  // what this rank contributes
};

// Counts all_reduce calls and every collective, and the bytes each rank contributes to
// all-gathers. With `count_splits`, the communicators split from this one count too, into the
// same counters (a mesh built over it counts its axes' calls); `gather_bytes`, when given,
// receives the all-gather bytes as well.
class CountingCommunicator : public InterceptingCommunicator {
 public:
  explicit CountingCommunicator(std::shared_ptr<Communicator> inner, bool count_splits = false,
                                std::shared_ptr<std::atomic<int64_t>> gather_bytes = nullptr)
      : CountingCommunicator(std::move(inner), count_splits, std::move(gather_bytes),
                             std::make_shared<CallCounts>()) {}

  int collectives() const { return counts_->collectives; }
  int all_reduces() const { return counts_->all_reduces; }
  int64_t all_gather_bytes() const { return counts_->all_gather_bytes; }

 private:
  CountingCommunicator(std::shared_ptr<Communicator> inner, bool count_splits,
                       std::shared_ptr<std::atomic<int64_t>> gather_bytes,
                       std::shared_ptr<CallCounts> counts)
      : InterceptingCommunicator(
            std::move(inner),
            [counts, gather_bytes](Call call, int64_t bytes) {
              if (call == Call::kSend || call == Call::kRecv) return;
              ++counts->collectives;
              if (call == Call::kAllReduce) ++counts->all_reduces;
              if (call != Call::kAllGather) return;
              counts->all_gather_bytes += bytes;
              if (gather_bytes) *gather_bytes += bytes;
            },
            count_splits),
        counts_(std::move(counts)) {}

  std::shared_ptr<CallCounts> counts_;
};

}  // namespace qmesh::testing
