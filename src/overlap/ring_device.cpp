#include "ring_device.h"

#include "qmesh/error.h"

namespace qmesh::overlap_detail {

void require_two_streams(Stream compute, Stream comm, const char* op) {
  QMESH_CHECK(compute.handle && comm.handle && compute.handle != comm.handle, op,
              ": CUDA tensors need two distinct, non-null streams (compute, comm) in "
              "CollectiveGemmStreams; got compute ",
              compute.handle, " and comm ", comm.handle, "; create them with cudaStreamCreate");
}

}  // namespace qmesh::overlap_detail
