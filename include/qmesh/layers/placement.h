// Where a model's layers run: the device that holds their parameters, activations and
// scaling state, and the stream their kernels, copies and collectives are ordered on.
#pragma once

#include "qmesh/device.h"
#include "qmesh/stream.h"

namespace qmesh {

struct Placement {
  Device device = Device::host();
  // A cudaStream_t of `device` (nullptr: the legacy default stream); ignored on the host.
  // Layer calls on CUDA return once their work is enqueued here: synchronize this stream
  // before reading results on the host.
  Stream stream;
  // Sequence-parallel layers on CUDA only: a second cudaStream_t of `device`, different from
  // `stream`, on which the collective GEMMs move their chunks while the GEMMs run on `stream`
  // (overlap/collective_gemm.h); both must then be non-null. Ignored otherwise.
  Stream comm_stream;
};

}  // namespace qmesh
