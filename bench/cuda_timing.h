// CUDA-event timing shared by the GPU benchmark programs.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <functional>
#include <vector>

#include "qmesh/cuda_check.h"

namespace qmesh::bench {

// The median milliseconds of `iters` (>= 1) calls of `launch`, each enqueuing work on `stream`,
// timed by CUDA events recorded between them. Waits for the last call's work.
inline double median_launch_ms(int iters, cudaStream_t stream,
                               const std::function<void()>& launch) {
  std::vector<cudaEvent_t> events(static_cast<size_t>(iters) + 1);
  for (auto& e : events) QMESH_CHECK_CUDA(cudaEventCreate(&e));
  QMESH_CHECK_CUDA(cudaEventRecord(events[0], stream));
  for (size_t i = 1; i < events.size(); ++i) {
    launch();
    QMESH_CHECK_CUDA(cudaEventRecord(events[i], stream));
  }
  QMESH_CHECK_CUDA(cudaEventSynchronize(events.back()));
  std::vector<float> ms(static_cast<size_t>(iters));
  for (size_t i = 0; i < ms.size(); ++i)
    QMESH_CHECK_CUDA(cudaEventElapsedTime(&ms[i], events[i], events[i + 1]));
  for (auto& e : events) (void)cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace qmesh::bench
