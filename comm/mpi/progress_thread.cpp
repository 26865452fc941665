#include "mpi/progress_thread.h"

#include <mpi.h>

#include <chrono>

#include "qmesh/logging.h"
#include "qmesh/param.h"

namespace qmesh::mpi {

namespace {

QMESH_PARAM(progress_thread_enabled, "MPI_PROGRESS_THREAD", 1)
QMESH_PARAM(progress_interval_us, "MPI_PROGRESS_INTERVAL_US", 50)

bool mpi_usable() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

// Whether background progress is on for this process (decided once, on first use).
bool enabled() {
  static const bool on = [] {
    if (progress_thread_enabled() == 0) return false;
    int level = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    if (level < MPI_THREAD_MULTIPLE) {
      QMESH_LOG_INFO("MPI background progress is off: MPI provides thread level ", level,
                     " < MPI_THREAD_MULTIPLE");
      return false;
    }
    return true;
  }();
  return on;
}

}  // namespace

ProgressThread::Active::Active(ProgressThread* owner) : owner_(owner) {
  if (owner_) owner_->begin();
}
ProgressThread::Active::Active(Active&& other) noexcept : owner_(other.owner_) {
  other.owner_ = nullptr;
}
ProgressThread::Active& ProgressThread::Active::operator=(Active&& other) noexcept {
  if (this != &other) {
    release();
    owner_ = other.owner_;
    other.owner_ = nullptr;
  }
  return *this;
}
ProgressThread::Active::~Active() { release(); }
void ProgressThread::Active::release() {
  if (owner_) owner_->end();
  owner_ = nullptr;
}

namespace {
std::mutex instance_mu;
ProgressThread* instance = nullptr;  // created on first use, never destroyed
bool stopped = false;                // stop() was called: no thread from now on
}  // namespace

ProgressThread* ProgressThread::started() {
  std::lock_guard lock(instance_mu);
  if (!instance && !stopped) instance = new ProgressThread;
  return stopped ? nullptr : instance;
}

ProgressThread::Active ProgressThread::track() {
  if (!enabled()) return Active();
  return Active(started());
}

void ProgressThread::stop() {
  ProgressThread* t = nullptr;
  {
    std::lock_guard lock(instance_mu);
    stopped = true;
    t = instance;
  }
  if (!t || !t->thread_.joinable()) return;
  {
    std::lock_guard lock(t->mu_);
    t->stop_ = true;
  }
  t->wake_.notify_all();
  t->thread_.join();
}

ProgressThread::ProgressThread() : thread_([this] { run(); }) {}

void ProgressThread::begin() {
  {
    std::lock_guard lock(mu_);
    ++active_;
  }
  wake_.notify_one();
}

void ProgressThread::end() {
  std::lock_guard lock(mu_);
  --active_;
}

void ProgressThread::run() {
  const auto interval = std::chrono::microseconds(progress_interval_us());
  std::unique_lock lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || active_ > 0; });
    if (stop_) return;
    lock.unlock();
    if (mpi_usable()) {  // stop() joins this thread before MpiSession finalizes MPI
      int flag = 0;
      MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &flag, MPI_STATUS_IGNORE);
    }
    std::this_thread::sleep_for(interval);
    lock.lock();
  }
}

}  // namespace qmesh::mpi
