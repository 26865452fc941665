// The ranks a communication benchmark runs on, chosen by --backend: "local" (threads in this
// process), "mpi" (this process is one rank under mpirun) or "ucx" (UCX, launched and
// bootstrapped by MPI). Shared by comm_bench and cgemm_bench.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "qmesh/comm/local.h"
#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_MPI
#include "qmesh/comm/mpi.h"
#endif
#if QMESH_WITH_UCX
#include "qmesh/comm/ucx.h"
#endif

namespace qmesh::bench {

// Runs fn(comm) on every rank of the chosen backend (`local_ranks` threads for "local").
// Blocking; exceptions of any rank propagate. Error for a backend this build lacks.
inline void run_on_world(int* argc, char*** argv, const std::string& backend, int local_ranks,
                         const std::function<void(Communicator&)>& fn) {
  if (backend == "local") {
    run_local_ranks(local_ranks, fn);
    return;
  }
#if QMESH_WITH_MPI
  MpiSession session(argc, argv);
  std::shared_ptr<Communicator> world;
  if (backend == "ucx") {
#if QMESH_WITH_UCX
    world = make_ucx_world(*make_mpi_bootstrap());
#else
    QMESH_THROW("this build has no UCX backend (QMESH_WITH_UCX=OFF)");
#endif
  } else {
    world = make_mpi_world();
  }
  fn(*world);
#else
  (void)argc;
  (void)argv;
  QMESH_THROW("--backend ", backend, ": this build has no MPI backend (QMESH_WITH_MPI=OFF); ",
              "use --backend local");
#endif
}

}  // namespace qmesh::bench
