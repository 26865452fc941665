// The CUDA half of copy_between (stream_copy.h), compiled only with QMESH_WITH_CUDA; host
// code calls it through qmesh/detail/cuda_dispatch.h. Internal to qmesh_comm.
#pragma once

#include <cstddef>

#include "stream_copy.h"

namespace qmesh::comm_detail::cuda {

// copy_between for endpoints of which one at least is on a CUDA device, both already checked
// with require_device.
void copy_between(const Endpoint& dst, const Endpoint& src, size_t bytes);

}  // namespace qmesh::comm_detail::cuda
