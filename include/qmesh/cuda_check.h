// Check macro for the CUDA runtime, for qmesh's sources and for code that calls the CUDA
// runtime beside qmesh (it needs the CUDA toolkit's headers). A failing call throws
// qmesh::Error with the call's text and the runtime's own error string.
//
// The runtime also records every failing call as the thread's "last error", which the next
// cudaGetLastError() returns (the check after each kernel launch). A failure that was thrown
// and handled (an out-of-memory cudaMalloc the caller recovers from) would then be reported
// again by an unrelated launch, so the macro clears it before throwing; sticky errors (a
// faulted context) cannot be cleared and keep failing every later call, as they must.
#pragma once

#include <cuda_runtime_api.h>

#include "qmesh/error.h"

#define QMESH_CHECK_CUDA(call)                                                                 \
  do {                                                                                         \
    const cudaError_t qmesh_status_ = (call);                                                  \
    if (qmesh_status_ != cudaSuccess) [[unlikely]] {                                           \
      (void)cudaGetLastError();                                                                \
      throw ::qmesh::Error(::qmesh::ErrorKind::kRuntime, "CUDA runtime call failed", __FILE__, \
                           __LINE__, #call,                                                    \
                           ::qmesh::detail::concat(cudaGetErrorName(qmesh_status_), ": ",      \
                                                   cudaGetErrorString(qmesh_status_)));        \
    }                                                                                          \
  } while (0)
