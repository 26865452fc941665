// Library version and build configuration, for logs and bug reports.
#pragma once

#include <string>

#include "qmesh/export.h"

namespace qmesh {

// "qmesh 0.1.0 (cuda=on nccl=on mpi=on ucx=on blas=on)"
QMESH_API std::string build_info();

}  // namespace qmesh
