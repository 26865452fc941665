// parallel_for for the CPU backend: splits [0, n) into one contiguous chunk per thread.
// Threads are started per call (a few tens of microseconds), so callers pass a grain that
// keeps small inputs on the calling thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

#include "qmesh/cpu_threads.h"
#include "qmesh/param.h"

namespace qmesh::detail::cpu {

// QMESH_CPU_THREADS: threads of the CPU backend; 0 (default) means one per hardware thread.
QMESH_PARAM(cpu_threads_param, "CPU_THREADS", 0)

// Threads per op: QMESH_CPU_THREADS (or one per hardware thread), capped by
// set_cpu_thread_limit.
inline int cpu_threads() {
  const int64_t p = cpu_threads_param();
  const int threads = p > 0 ? static_cast<int>(p)
                            : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int limit = cpu_thread_limit();
  return limit > 0 ? std::min(threads, limit) : threads;
}

// The number of chunks parallel_for will use for (n, grain).
inline int parallel_chunks(int64_t n, int64_t grain) {
  return static_cast<int>(std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, cpu_threads()));
}

// Calls fn(begin, end, chunk) on up to cpu_threads() chunks of [0, n), each at least `grain`
// long (so n < 2 * grain runs on the caller). Chunk boundaries depend only on n, grain and
// the thread count. Exceptions from any chunk are rethrown after all chunks finish.
template <class Fn>
void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
  const int64_t chunks = parallel_chunks(n, grain);
  if (chunks == 1) {
    fn(int64_t{0}, n, 0);
    return;
  }
  std::vector<std::exception_ptr> errors(chunks);
  auto run = [&](int64_t c) {
    try {
      fn(n * c / chunks, n * (c + 1) / chunks, static_cast<int>(c));
    } catch (...) {
      errors[c] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(chunks - 1);
  for (int64_t c = 1; c < chunks; ++c) threads.emplace_back(run, c);
  run(0);
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace qmesh::detail::cpu
