#include "mpi/bounded_call.h"

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "qmesh/comm/work.h"

namespace qmesh::mpi {

void bounded_call(const char* what, std::chrono::milliseconds limit,
                  const std::function<void()>& call) {
  std::mutex mu;
  std::condition_variable finished;
  bool done = false;
  std::thread watchdog([&] {
    std::unique_lock lock(mu);
    if (finished.wait_for(lock, limit, [&] { return done; })) return;
    std::fprintf(stderr,
                 "qmesh: %s did not return within %g s (QMESH_COMM_TIMEOUT_S): another rank "
                 "is dead or stuck; exiting with status 1\n",
                 what, std::chrono::duration<double>(limit).count());
    std::fflush(nullptr);
    std::_Exit(1);
  });
  struct Finish {  // stops the watchdog however `call` ends
    std::mutex& mu;
    std::condition_variable& finished;
    bool& done;
    std::thread& watchdog;
    ~Finish() {
      {
        std::lock_guard lock(mu);
        done = true;
      }
      finished.notify_one();
      watchdog.join();
    }
  } finish{mu, finished, done, watchdog};
  call();
}

std::chrono::milliseconds bounded_call_limit() {
  try {
    return comm_timeout();
  } catch (const std::exception&) {
    return std::chrono::minutes(5);
  }
}

}  // namespace qmesh::mpi
