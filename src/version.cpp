#include "qmesh/version.h"

#include "qmesh/config.h"

namespace qmesh {

std::string build_info() {
  auto on = [](int flag) { return flag ? "on" : "off"; };
  return std::string("qmesh ") + QMESH_VERSION_STRING + " (cuda=" + on(QMESH_WITH_CUDA) +
         " nccl=" + on(QMESH_WITH_NCCL) + " mpi=" + on(QMESH_WITH_MPI) +
         " ucx=" + on(QMESH_WITH_UCX) + " blas=" + on(QMESH_WITH_BLAS) + ")";
}

}  // namespace qmesh
