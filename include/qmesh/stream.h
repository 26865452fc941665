// The stream an operation is ordered on: a cudaStream_t for work on CUDA tensors (nullptr is
// the legacy default stream), ignored for host tensors. Kept as void* so that headers stay
// free of CUDA includes.
#pragma once

namespace qmesh {

struct Stream {
  void* handle = nullptr;  // cudaStream_t
};

}  // namespace qmesh
