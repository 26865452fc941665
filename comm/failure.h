// A process-wide record that a communicator failed: an operation timed out and left it
// unusable, or its transport reported an error. MpiSession reads it: a process that leaves because
// a communicator failed must not call MPI_Finalize, which would wait for the failed peer forever.
#pragma once

#include "qmesh/export.h"

namespace qmesh::comm_detail {

// Records that a communicator operation failed in this process. Thread-safe.
QMESH_API void record_failure() noexcept;
// True once record_failure() was called in this process.
QMESH_API bool failure_recorded() noexcept;

}  // namespace qmesh::comm_detail
