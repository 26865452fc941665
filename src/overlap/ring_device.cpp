#include "ring_device.h"

#include "qmesh/config.h"
#include "qmesh/error.h"

#if QMESH_WITH_CUDA
#include <cuda_runtime_api.h>

#include "cuda/stream_scratch.h"
#include "qmesh/cuda_check.h"
#endif

namespace qmesh::overlap_detail {

void require_two_streams(Stream compute, Stream comm, const char* op) {
  QMESH_CHECK(compute.handle && comm.handle && compute.handle != comm.handle, op,
              ": CUDA tensors need two distinct, non-null streams (compute, comm) in "
              "CollectiveGemmStreams; got compute ",
              compute.handle, " and comm ", comm.handle, "; create them with cudaStreamCreate");
}

#if QMESH_WITH_CUDA

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

// add_fp32_async: ring_add.cu; max_fp32_async, poison_unless_same_async: ring_checks.cu.

#else

namespace {
[[noreturn]] void no_cuda() {
  QMESH_THROW(
      "collective GEMM on CUDA tensors: this build of qmesh has no CUDA support "
      "(configure with QMESH_WITH_CUDA=ON)");
}
}  // namespace

void* record_event(Stream) { no_cuda(); }
void wait_event(Stream, void*) { no_cuda(); }
void destroy_event(void*) noexcept {}
void join_streams(Stream, Stream) noexcept {}
void* alloc_async(size_t, Stream) { no_cuda(); }
void free_async(void*, Stream) noexcept {}
void copy_async(void*, const void*, size_t, Stream) { no_cuda(); }
void add_fp32_async(float*, const float*, const float*, int64_t, Stream) { no_cuda(); }
void max_fp32_async(float*, const float*, int, Stream) { no_cuda(); }
void poison_unless_same_async(const float*, int, int, void*, int64_t, int, uint32_t, float*,
                              Stream) {
  no_cuda();
}

#endif

}  // namespace qmesh::overlap_detail
