#include "qmesh/cpu_threads.h"

#include <atomic>

#include "qmesh/config.h"
#include "qmesh/error.h"

#if QMESH_WITH_BLAS
#include <cblas.h>
#endif

namespace qmesh {

namespace {
std::atomic<int> g_limit{0};
}

void set_cpu_thread_limit(int threads) {
  QMESH_CHECK(threads >= 0, "set_cpu_thread_limit: threads must be >= 0 (0 = no cap), not ",
              threads);
  g_limit.store(threads, std::memory_order_relaxed);
#if QMESH_WITH_BLAS
  // OpenBLAS's own default is one thread per core, like QMESH_CPU_THREADS=0.
  if (threads > 0) openblas_set_num_threads(threads);
#endif
}

int cpu_thread_limit() { return g_limit.load(std::memory_order_relaxed); }

}  // namespace qmesh
