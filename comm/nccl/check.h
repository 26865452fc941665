// Check macro for NCCL calls (internal to the NCCL backend): a failing call throws
// qmesh::Error with the call's text, ncclGetErrorString and NCCL's last error message.
// ncclInProgress is not a failure: non-blocking communicators return it for work still
// being set up, which the caller then settles through ncclCommGetAsyncError.
#pragma once

#include <nccl.h>

#include "qmesh/error.h"

#define QMESH_CHECK_NCCL(call)                                                                   \
  do {                                                                                           \
    const ncclResult_t qmesh_nccl_status_ = (call);                                              \
    if (qmesh_nccl_status_ != ncclSuccess && qmesh_nccl_status_ != ncclInProgress) [[unlikely]]  \
      throw ::qmesh::Error(::qmesh::ErrorKind::kRuntime, "NCCL call failed", __FILE__, __LINE__, \
                           #call,                                                                \
                           ::qmesh::detail::concat(ncclGetErrorString(qmesh_nccl_status_), " (", \
                                                   ncclGetLastError(nullptr), ")"));             \
  } while (0)
