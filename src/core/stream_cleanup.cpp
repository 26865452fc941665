#include "core/stream_cleanup.h"

#include <exception>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "qmesh/logging.h"

namespace qmesh::detail {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<void*, std::vector<std::function<void()>>> cleanups;
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: streams may outlive static teardown
  return *r;
}

}  // namespace

void at_stream_destroy(void* stream, std::function<void()> cleanup) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.cleanups[stream].push_back(std::move(cleanup));
}

void run_stream_cleanups(void* stream) noexcept {
  std::vector<std::function<void()>> todo;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    auto it = r.cleanups.find(stream);
    if (it == r.cleanups.end()) return;
    todo = std::move(it->second);
    r.cleanups.erase(it);
  }
  for (auto& cleanup : todo) {
    try {
      cleanup();
    } catch (const std::exception& e) {
      QMESH_LOG_WARN("releasing a resource of stream ", stream, " failed: ", e.what());
    } catch (...) {
      QMESH_LOG_WARN("releasing a resource of stream ", stream, " failed");
    }
  }
}

}  // namespace qmesh::detail
