// Blocking MPI calls that have no nonblocking form and wait for other ranks (MPI_Init_thread,
// MPI_Finalize, MPI_Comm_split, MPI_Comm_split_type) cannot be abandoned: a rank that died or
// froze meanwhile would keep the caller inside MPI forever. bounded_call runs one under a
// watchdog that ends the process (status 1, after printing what did not return) when it
// has not returned within `limit`. Internal to the MPI backend.
#pragma once

#include <chrono>
#include <functional>

namespace qmesh::mpi {

void bounded_call(const char* what, std::chrono::milliseconds limit,
                  const std::function<void()>& call);

// comm_timeout(), or its default when QMESH_COMM_TIMEOUT_S is invalid (the first
// communicator that reads it reports that).
std::chrono::milliseconds bounded_call_limit();

}  // namespace qmesh::mpi
