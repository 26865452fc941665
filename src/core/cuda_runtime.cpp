#include "core/cuda_runtime.h"

#include "qmesh/cuda_check.h"
#include "qmesh/device.h"

namespace qmesh::detail::cuda {

int device_count() {
  // Without a driver this returns cudaErrorInsufficientDriver (35) and leaves `count`
  // untouched, hence the initialisation. The sticky error is cleared for later calls.
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

int make_current(int device) {
  int current = 0;
  QMESH_CHECK_CUDA(cudaGetDevice(&current));
  if (current != device) {
    QMESH_CHECK_CUDA(cudaSetDevice(device));
    return current;
  }
  return -1;
}

int make_current(int device, std::nothrow_t) noexcept {
  int current = 0;
  if (cudaGetDevice(&current) == cudaSuccess && current != device &&
      cudaSetDevice(device) == cudaSuccess)
    return current;
  return -1;
}

void restore_current(int device) noexcept { (void)cudaSetDevice(device); }

void synchronize(int device, Stream stream) {
  const DeviceGuard guard(device);
  QMESH_CHECK_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(stream.handle)));
}

void order_after(int device, Stream waiter, Stream producer) {
  const DeviceGuard guard(device);
  cudaEvent_t event = nullptr;
  QMESH_CHECK_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  cudaError_t status = cudaEventRecord(event, static_cast<cudaStream_t>(producer.handle));
  if (status == cudaSuccess)
    status = cudaStreamWaitEvent(static_cast<cudaStream_t>(waiter.handle), event, 0);
  (void)cudaEventDestroy(event);  // released by CUDA once recorded work completes
  QMESH_CHECK_CUDA(status);
}

void* allocate(int device, size_t bytes) {
  const DeviceGuard guard(device);
  void* p = nullptr;
  QMESH_CHECK_CUDA(cudaMalloc(&p, bytes));
  return p;
}

void deallocate(int device, void* p) noexcept {
  // A destructor must not throw: errors are ignored. The owning device is made current,
  // as for the allocation (cudaFree synchronizes the current device).
  const DeviceGuard guard(device, std::nothrow);
  (void)cudaFree(p);
}

void* create_stream(int device) {
  const DeviceGuard guard(device);
  cudaStream_t stream = nullptr;
  QMESH_CHECK_CUDA(cudaStreamCreate(&stream));
  return stream;
}

void destroy_stream(void* stream) noexcept {
  (void)cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

void copy(void* dst, const void* src, size_t bytes, int device) {
  // cudaMemcpy alone would not keep the blocking promise: from pageable host memory it may
  // return before the DMA to the device has finished, and device to device it does not block
  // the host at all (CUDA runtime, "API synchronization behavior"). So the copy goes on the
  // legacy default stream of the device involved (made current: that stream is per device,
  // and it orders the copy after the device's blocking streams) and the host waits for it.
  const DeviceGuard guard(device);
  QMESH_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamLegacy));
  QMESH_CHECK_CUDA(cudaStreamSynchronize(cudaStreamLegacy));
}

void copy_async(void* dst, const void* src, size_t bytes, int device, Stream stream) {
  // A null stream is the legacy default stream of the current device: make it `device`'s.
  const DeviceGuard guard(device);
  QMESH_CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault,
                                   static_cast<cudaStream_t>(stream.handle)));
}

void copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t rows, int device, Stream stream) {
  const DeviceGuard guard(device);
  QMESH_CHECK_CUDA(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows, cudaMemcpyDefault,
                                     static_cast<cudaStream_t>(stream.handle)));
}

}  // namespace qmesh::detail::cuda
