// Check macro for the CUDA runtime (internal to qmesh's sources). A failing
// call throws qmesh::Error with the call's text and the library's own error string.
#pragma once

#include <cuda_runtime_api.h>

#include "qmesh/error.h"

#define QMESH_CHECK_CUDA(call)                                                            \
  do {                                                                                    \
    const cudaError_t qmesh_status_ = (call);                                             \
    if (qmesh_status_ != cudaSuccess) [[unlikely]]                                        \
      throw ::qmesh::Error("CUDA runtime call failed", __FILE__, __LINE__, #call,         \
                           ::qmesh::detail::concat(cudaGetErrorName(qmesh_status_), ": ", \
                                                   cudaGetErrorString(qmesh_status_)));   \
  } while (0)
