// The world communicator of a test run under mpirun: the MPI backend's, or the UCX backend's
// (MPI then only launches the ranks and carries the bootstrap) when the test runs with
// QMESH_TEST_WORLD=ucx, which ctest sets for the UCX variants of a test. Created on first
// use; lives until the process exits.
#pragma once

#include <memory>
#include <string>

#include "qmesh/comm/communicator.h"
#include "qmesh/comm/mpi.h"
#include "qmesh/config.h"
#include "qmesh/error.h"
#include "qmesh/param.h"
#if QMESH_WITH_UCX
#include "qmesh/comm/ucx.h"
#endif

namespace qmesh::testing_world {

inline std::shared_ptr<Communicator> world() {
  static const std::shared_ptr<Communicator> w = []() -> std::shared_ptr<Communicator> {
    const std::string backend = param_string("TEST_WORLD", "mpi");  // a test-only variable
    if (backend == "mpi") return make_mpi_world();
#if QMESH_WITH_UCX
    if (backend == "ucx") return make_ucx_world(*make_mpi_bootstrap());
#endif
    QMESH_THROW("QMESH_TEST_WORLD=", backend, " is not a backend of this build (mpi",
                QMESH_WITH_UCX ? ", ucx" : "", ")");
  }();
  return w;
}

}  // namespace qmesh::testing_world
