#include "failure.h"

#include <atomic>

namespace qmesh::comm_detail {
namespace {
std::atomic<bool> failed{false};
}  // namespace

void record_failure() noexcept { failed.store(true, std::memory_order_relaxed); }

bool failure_recorded() noexcept { return failed.load(std::memory_order_relaxed); }

}  // namespace qmesh::comm_detail
