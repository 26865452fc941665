// Check macro for UCX calls (internal to the UCX backend): a failing call throws
// qmesh::Error with the call's text and ucs_status_string.
#pragma once

#include <ucs/type/status.h>

#include "qmesh/error.h"

#define QMESH_CHECK_UCX(call)                                                                   \
  do {                                                                                          \
    const ucs_status_t qmesh_ucs_status_ = (call);                                              \
    if (qmesh_ucs_status_ != UCS_OK) [[unlikely]]                                               \
      throw ::qmesh::Error(::qmesh::ErrorKind::kRuntime, "UCX call failed", __FILE__, __LINE__, \
                           #call, ucs_status_string(qmesh_ucs_status_));                        \
  } while (0)
