#include "cuda/stream_scratch.h"

#include <cstdint>
#include <mutex>
#include <set>

#include "cuda/stream_memory.h"
#include "qmesh/device.h"

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

void* allocate_in_stream_order(int device, size_t bytes, Stream stream) {
  const DeviceGuard guard(device);
  return stream_alloc(bytes, static_cast<cudaStream_t>(stream.handle));
}

void free_in_stream_order(int device, void* p, Stream stream) noexcept {
  const DeviceGuard guard(device, std::nothrow);
  (void)cudaFreeAsync(p, static_cast<cudaStream_t>(stream.handle));
}

}  // namespace qmesh::detail::cuda
