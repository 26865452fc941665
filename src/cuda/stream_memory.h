// Stream-ordered device memory behind CUDA-free signatures (internal; cuda/stream_scratch.cpp),
// for code compiled in every build that calls it only through detail::on_cuda.
#pragma once

#include <cstddef>

#include "qmesh/stream.h"

namespace qmesh::detail::cuda {

// `bytes` of memory of CUDA device `device`, allocated in `stream`'s order (stream_alloc in
// cuda/stream_scratch.h: the device's default pool, which keeps freed memory).
void* allocate_in_stream_order(int device, size_t bytes, Stream stream);
// Releases it in `stream`'s order: after the work enqueued on `stream` so far, without
// waiting for the device (cudaFreeAsync). Never throws.
void free_in_stream_order(int device, void* p, Stream stream) noexcept;

}  // namespace qmesh::detail::cuda
