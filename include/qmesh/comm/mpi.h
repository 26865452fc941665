// The MPI backend (library qmesh::comm_mpi; present when built with QMESH_WITH_MPI): host
// buffers over Open MPI's nonblocking collectives and point-to-point, each wait polled with
// MPI_Test against a deadline. Communicators use MPI_ERRORS_RETURN, so MPI failures become
// qmesh::Error instead of aborting the job.
#pragma once

#include <memory>

#include "qmesh/comm/bootstrap.h"
#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"

namespace qmesh {

// Initializes MPI (MPI_Init_thread asking for MPI_THREAD_MULTIPLE) unless it already is, and
// finalizes it on destruction if this object initialized it (after stopping the backend's
// background progress thread). One per process, created before any other MPI call.
// The destructor does not finalize when an exception is unwinding through it or a
// communicator of this process failed (a timeout or an MPI error): a peer may be dead, and
// MPI_Finalize would wait for it forever; the process then ends with the status its error
// handling gives. MPI_Init_thread and MPI_Finalize, which wait for every rank, are bounded
// by QMESH_COMM_TIMEOUT_S: past it, the process prints why and exits with status 1.
class QMESH_API MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owns_ = false;
};

// A communicator over a duplicate of MPI_COMM_WORLD. MPI must be initialized (Error
// otherwise).
QMESH_API std::shared_ptr<Communicator> make_mpi_world();

// A Bootstrap over a duplicate of MPI_COMM_WORLD.
QMESH_API std::unique_ptr<Bootstrap> make_mpi_bootstrap();

}  // namespace qmesh
