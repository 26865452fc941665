// overlap/ring_device.h in a build with CUDA (without CUDA: overlap/ring_device_no_cuda.cpp).
#include "overlap/ring_device.h"

#include <cuda_runtime_api.h>

#include "cuda/stream_scratch.h"
#include "qmesh/cuda_check.h"

namespace qmesh::overlap_detail {

namespace {
cudaStream_t native(Stream s) { return static_cast<cudaStream_t>(s.handle); }
}  // namespace

void* record_event(Stream stream) {
  cudaEvent_t event = nullptr;
  QMESH_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  const cudaError_t status = cudaEventRecord(event, native(stream));
  if (status != cudaSuccess) (void)cudaEventDestroy(event);
  QMESH_CHECK_CUDA(status);
  return event;
}

void wait_event(Stream stream, void* event) {
  QMESH_CHECK_CUDA(cudaStreamWaitEvent(native(stream), static_cast<cudaEvent_t>(event), 0));
}

void destroy_event(void* event) noexcept {
  (void)cudaEventDestroy(static_cast<cudaEvent_t>(event));
}

void join_streams(Stream into, Stream from) noexcept {
  cudaEvent_t event = nullptr;
  if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) return;
  if (cudaEventRecord(event, native(from)) == cudaSuccess)
    (void)cudaStreamWaitEvent(native(into), event, 0);
  (void)cudaEventDestroy(event);
}

void* alloc_async(size_t bytes, Stream stream) {
  return detail::cuda::stream_alloc(bytes, native(stream));
}

void free_async(void* p, Stream stream) noexcept { (void)cudaFreeAsync(p, native(stream)); }

void copy_async(void* dst, const void* src, size_t bytes, Stream stream) {
  QMESH_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, native(stream)));
}

void zero_async(void* dst, size_t bytes, Stream stream) {
  QMESH_CHECK_CUDA(cudaMemsetAsync(dst, 0, bytes, native(stream)));
}

// add_fp32_async: ring_add.cu; max_fp32_async, poison_unless_same_async: ring_checks.cu.

}  // namespace qmesh::overlap_detail
