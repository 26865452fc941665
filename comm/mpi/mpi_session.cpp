#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "failure.h"
#include "mpi/check.h"
#include "mpi/progress_thread.h"
#include "qmesh/comm/mpi.h"
#include "qmesh/comm/work.h"
#include "qmesh/logging.h"

namespace qmesh {
namespace {

// MPI_Init_thread and MPI_Finalize synchronize with the other ranks; a rank that died or
// froze would keep them waiting forever. A watchdog ends the process (status 1, with a
// message) when `call` has not returned within `limit`.
void run_within(const char* what, std::chrono::milliseconds limit,
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

// comm_timeout(), or its default when QMESH_COMM_TIMEOUT_S is invalid (reported by the first
// communicator that reads it).
std::chrono::milliseconds session_timeout() {
  try {
    return comm_timeout();
  } catch (const std::exception&) {
    return std::chrono::minutes(5);
  }
}

}  // namespace

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  QMESH_CHECK_MPI(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    run_within("MPI_Init_thread", session_timeout(), [&] {
      QMESH_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    });
    owns_ = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      QMESH_LOG_WARN("MPI provides thread level ", provided,
                     " < MPI_THREAD_MULTIPLE: issue and "
                     "wait on MPI communicators from one thread at a time");
    }
  }
  // Errors become return codes (and so qmesh::Error) instead of aborting the job.
  QMESH_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!owns_ || finalized) return;
  mpi::ProgressThread::stop();  // never inside MPI while it shuts down
  if (std::uncaught_exceptions() > 0 || comm_detail::failure_recorded()) {
    // A peer may be dead: MPI_Finalize would wait for it. The process ends unfinalized with
    // the status its error handling gives (mpirun then reports the job as failed).
    std::fflush(nullptr);
    return;
  }
  run_within("MPI_Finalize", session_timeout(), [] { MPI_Finalize(); });
}

}  // namespace qmesh
