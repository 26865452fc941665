// Check macro for cuBLASLt (internal to qmesh's sources). A failing call throws qmesh::Error
// with the call's text and cuBLASLt's own status name and description.
#pragma once

#include <cublasLt.h>

#include "qmesh/error.h"

#define QMESH_CHECK_CUBLAS(call)                                                               \
  do {                                                                                         \
    const cublasStatus_t qmesh_status_ = (call);                                               \
    if (qmesh_status_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                   \
      throw ::qmesh::Error(::qmesh::ErrorKind::kRuntime, "cuBLASLt call failed", __FILE__,     \
                           __LINE__, #call,                                                    \
                           ::qmesh::detail::concat(cublasLtGetStatusName(qmesh_status_), ": ", \
                                                   cublasLtGetStatusString(qmesh_status_)));   \
  } while (0)
