#include <mpi.h>

#include "mpi/check.h"
#include "mpi/progress_thread.h"
#include "qmesh/comm/mpi.h"
#include "qmesh/logging.h"

namespace qmesh {

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  QMESH_CHECK_MPI(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    QMESH_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    owns_ = true;
    if (provided < MPI_THREAD_MULTIPLE) {
      QMESH_LOG_WARN("MPI provides thread level ", provided,
                     " < MPI_THREAD_MULTIPLE: issue and "
                     "wait on MPI communicators from one thread at a time");
    }
  }
  // Errors become return codes (and so qmesh::Error) instead of aborting the job.
  QMESH_CHECK_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!owns_ || finalized) return;
  mpi::ProgressThread::stop();  // never inside MPI while it shuts down
  MPI_Finalize();
}

}  // namespace qmesh
