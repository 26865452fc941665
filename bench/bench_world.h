// The ranks a communication benchmark runs on, chosen by --backend: "local" (threads in this
// process), "mpi" (this process is one rank under mpirun) or "ucx" (UCX, launched and
// bootstrapped by MPI). Shared by comm_bench and cgemm_bench.
#pragma once

#include <cstdio>
#include <exception>
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

// main() of a benchmark over a world: options = parse(argc, argv) (which takes --backend and,
// for "local", the rank count), results = run(comm, options) on every rank, then
// report(results, options, ranks) on rank 0. Returns the exit status; an error is printed
// as "<name>: <message>".
template <class Parse, class Run, class Report>
int world_main(const char* name, int argc, char** argv, Parse parse, Run run, Report report) {
  try {
    const auto options = parse(argc, argv);
    run_on_world(&argc, &argv, options.backend, options.ranks, [&](Communicator& comm) {
      const auto results = run(comm, options);
      if (comm.rank() == 0) report(results, options, comm.size());
    });
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace qmesh::bench
