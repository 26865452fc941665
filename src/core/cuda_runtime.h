// Core's CUDA backend: the CUDA runtime calls behind Device, DeviceGuard, Buffer, OwnedStream
// and the copies (core/cuda_runtime.cpp, compiled only with QMESH_WITH_CUDA). The declarations
// name no CUDA type, so host files call them through qmesh/detail/cuda_dispatch.h. Arguments
// are checked by the callers; a failing runtime call throws qmesh::Error unless noted.
#pragma once

#include <cstddef>
#include <new>

#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

// The number of CUDA devices; 0 when the runtime reports an error (no driver), which is
// cleared for later calls.
int device_count();

// Makes `device` current; returns the device that was current before, or -1 if it was
// `device` already.
int make_current(int device);
// The same, for cleanup paths: a failed switch leaves the current device and returns -1.
int make_current(int device, std::nothrow_t) noexcept;
// Makes `device` current again at the end of a DeviceGuard; errors are ignored.
void restore_current(int device) noexcept;

// Waits for the work enqueued so far on `stream` of `device`.
void synchronize(int device, Stream stream);
// Orders `waiter` after the work enqueued so far on `producer` (streams of `device`).
void order_after(int device, Stream waiter, Stream producer);

// `bytes` of memory of `device` (cudaMalloc); deallocate ignores errors (for destructors).
void* allocate(int device, size_t bytes);
void deallocate(int device, void* p) noexcept;

// A new stream of `device` (cudaStreamCreate); destroy_stream ignores errors.
void* create_stream(int device);
void destroy_stream(void* stream) noexcept;

// Copies `bytes` (any direction, cudaMemcpyDefault) issued on CUDA device `device`: copy
// returns when they have arrived, copy_async enqueues the copy on `stream`.
void copy(void* dst, const void* src, size_t bytes, int device);
void copy_async(void* dst, const void* src, size_t bytes, int device, Stream stream);
// Enqueues `rows` rows of `width` bytes (row i from src + i * src_pitch to dst + i * dst_pitch,
// cudaMemcpyDefault) on `stream`.
void copy_rows_async(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                     size_t rows, int device, Stream stream);

}  // namespace qmesh::detail::cuda
