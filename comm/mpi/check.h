// Check macro for MPI calls (internal to the MPI backend). Communicators use
// MPI_ERRORS_RETURN, so a failing call returns its error code, which becomes a qmesh::Error
// with the call's text and MPI_Error_string's message, and is recorded as a communicator
// failure (failure.h: MpiSession then does not finalize MPI).
#pragma once

#include <mpi.h>

#include <string>

#include "failure.h"
#include "qmesh/error.h"

namespace qmesh::mpi {

inline std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, length);
}

}  // namespace qmesh::mpi

#define QMESH_CHECK_MPI(call)                                                                   \
  do {                                                                                          \
    const int qmesh_mpi_code_ = (call);                                                         \
    if (qmesh_mpi_code_ != MPI_SUCCESS) [[unlikely]] {                                          \
      ::qmesh::comm_detail::record_failure();                                                   \
      throw ::qmesh::Error(::qmesh::ErrorKind::kRuntime, "MPI call failed", __FILE__, __LINE__, \
                           #call, ::qmesh::mpi::error_string(qmesh_mpi_code_));                 \
    }                                                                                           \
  } while (0)
