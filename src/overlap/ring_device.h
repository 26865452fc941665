// CUDA pieces of the collective-GEMM rings (internal to src/overlap): events that order one
// stream after another, stream-ordered scratch memory, copies, and the fp32 sum of two
// partials. A build with CUDA compiles their CUDA backend (src/cuda/ring_device.cpp,
// ring_add.cu, ring_checks.cu); one without, ring_device_no_cuda.cpp, where every function
// that would act throws qmesh::Error (the rings reach them only for CUDA tensors, which such a
// build refuses first).
#pragma once

#include <cstddef>
#include <cstdint>

#include "qmesh/stream.h"

namespace qmesh::overlap_detail {

// Error unless `compute` and `comm` are two distinct, non-null streams, as the collective
// operations on CUDA tensors need (`op` names the operation in the message). Any build.
void require_two_streams(Stream compute, Stream comm, const char* op);

// A new event (timing disabled) recorded on `stream`; release it with destroy_event.
void* record_event(Stream stream);
// Work enqueued on `stream` after this call starts once `event` has completed.
void wait_event(Stream stream, void* event);
// Never throws; a pending event is released once it completes.
void destroy_event(void* event) noexcept;

// Work enqueued on `into` from now on waits for what `from` holds now. Never throws (errors
// are ignored: it runs on every exit path of a ring, error paths included).
void join_streams(Stream into, Stream from) noexcept;

// Stream-ordered allocation on the current device (cudaMallocAsync); usable by other
// streams once they wait for an event recorded on `stream` after this call.
void* alloc_async(size_t bytes, Stream stream);
// Stream-ordered release (cudaFreeAsync); never throws.
void free_async(void* p, Stream stream) noexcept;

// Enqueues a copy of `bytes` between device buffers on `stream`.
void copy_async(void* dst, const void* src, size_t bytes, Stream stream);
// Enqueues zeroing `bytes` bytes of device memory on `stream`.
void zero_async(void* dst, size_t bytes, Stream stream);

// Enqueues out[i] = a[i] + b[i] (fp32, round to nearest) for i < n on `stream`. `out` may be
// `a` or `b`.
void add_fp32_async(float* out, const float* a, const float* b, int64_t n, Stream stream);

// Enqueues *out = max of in[i * stride] for i < n (NaN-propagating: any NaN gives NaN; n >= 1)
// on `stream`.
void max_fp32_async(float* out, const float* in, int n, int stride, Stream stream);

// Enqueues on `stream`: unless every scales[p] (p < n) equals scales[rank], each of the
// `elems` elements of `d` (elem_bytes wide) becomes `nan_bits` and *amax (if not null)
// becomes NaN. Nothing is written when the scales agree; elems == 0 launches nothing for d.
void poison_unless_same_async(const float* scales, int n, int rank, void* d, int64_t elems,
                              int elem_bytes, uint32_t nan_bits, float* amax, Stream stream);

}  // namespace qmesh::overlap_detail
