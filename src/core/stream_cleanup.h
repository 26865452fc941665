// Cleanups tied to the life of a CUDA stream (internal to qmesh's libraries; exported so
// that libqmesh's GEMM can attach to the streams of libqmesh_core's OwnedStream). Parts of
// qmesh that cache a resource per stream (cuBLASLt's workspace) attach its release here;
// OwnedStream runs them before it destroys its stream. Streams that qmesh did not create
// keep their resources until the process exits. Thread-safe.
#pragma once

#include <functional>

#include "qmesh/export.h"

namespace qmesh::detail {

// Runs `cleanup` when `stream` (a cudaStream_t) is destroyed by an OwnedStream. The
// cleanup must wait for the stream's work itself if it frees memory that work uses.
QMESH_API void at_stream_destroy(void* stream, std::function<void()> cleanup);

// Runs and forgets the cleanups attached to `stream`, in the order they were attached. A
// cleanup that throws is logged and skipped; never throws.
QMESH_API void run_stream_cleanups(void* stream) noexcept;

}  // namespace qmesh::detail
