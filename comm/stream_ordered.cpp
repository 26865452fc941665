#include "qmesh/comm/stream_ordered.h"

namespace qmesh {

namespace {

bool without_host_wait(const Communicator& comm, const TensorView& buf) {
  return buf.device.is_cuda() && comm.stream_ordered();
}

}  // namespace

void all_reduce_in_stream_order(Communicator& comm, const TensorView& buf, ReduceOp op,
                                Stream stream) {
  if (without_host_wait(comm, buf))
    (void)comm.all_reduce_async(buf, op, stream);  // dropping the handle does not block
  else
    comm.all_reduce(buf, op, stream);
}

void all_gather_in_stream_order(Communicator& comm, const TensorView& in, const TensorView& out,
                                Stream stream) {
  if (without_host_wait(comm, in))
    (void)comm.all_gather_async(in, out, stream);
  else
    comm.all_gather(in, out, stream);
}

}  // namespace qmesh
