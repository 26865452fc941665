#include <mpi.h>

#include <cstdio>
#include <exception>

#include "failure.h"
#include "mpi/bounded_call.h"
#include "mpi/check.h"
#include "mpi/progress_thread.h"
#include "qmesh/comm/mpi.h"
#include "qmesh/comm/work.h"
#include "qmesh/logging.h"

namespace qmesh {

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  QMESH_CHECK_MPI(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = MPI_THREAD_SINGLE;
    mpi::bounded_call("MPI_Init_thread", mpi::bounded_call_limit(), [&] {
      QMESH_CHECK_MPI(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided));
    });
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
  if (std::uncaught_exceptions() > 0 || comm_detail::failure_recorded()) {
    // A peer may be dead: MPI_Finalize would wait for it. The process ends unfinalized with
    // the status its error handling gives (mpirun then reports the job as failed).
    std::fflush(nullptr);
    return;
  }
  mpi::bounded_call("MPI_Finalize", mpi::bounded_call_limit(), [] { MPI_Finalize(); });
}

}  // namespace qmesh
