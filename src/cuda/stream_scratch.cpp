#include "cuda/stream_scratch.h"

#include <cstdint>
#include <mutex>
#include <set>

namespace qmesh::detail::cuda {

void* stream_alloc(size_t bytes, cudaStream_t stream) {
  int device = 0;
  QMESH_CHECK_CUDA(cudaGetDevice(&device));
  {
    static std::mutex mutex;
    static std::set<int> configured;
    const std::lock_guard lock(mutex);
    if (configured.insert(device).second) {
      cudaMemPool_t pool = nullptr;
      QMESH_CHECK_CUDA(cudaDeviceGetDefaultMemPool(&pool, device));
      uint64_t keep_all = UINT64_MAX;
      QMESH_CHECK_CUDA(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all));
    }
  }
  void* p = nullptr;
  QMESH_CHECK_CUDA(cudaMallocAsync(&p, bytes, stream));
  return p;
}

}  // namespace qmesh::detail::cuda
