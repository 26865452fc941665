#include "qmesh/comm/stream_ordered.h"

#include "qmesh/copy.h"

namespace qmesh {

namespace {

// A one-rank all-gather or reduce-scatter: `in` is the result.
void copy_on_one_rank(const TensorView& in, const TensorView& out, Stream stream) {
  if (out.data != in.data)
    copy_bytes_async(out.data, out.device, in.data, in.device, in.nbytes(), stream);
}

}  // namespace

bool completes_in_stream_order(const Communicator& comm, const TensorView& buf) {
  return buf.device.is_cuda() && comm.stream_ordered();
}

void all_reduce_in_stream_order(Communicator& comm, const TensorView& buf, ReduceOp op,
                                Stream stream) {
  if (comm.size() == 1) return;  // the buffer is the result
  if (completes_in_stream_order(comm, buf))
    (void)comm.all_reduce_async(buf, op, stream);  // dropping the handle does not block
  else
    comm.all_reduce(buf, op, stream);
}

void all_gather_in_stream_order(Communicator& comm, const TensorView& in, const TensorView& out,
                                Stream stream) {
  if (comm.size() == 1) {
    comm_check::all_gather_args(in, out, 1);
    return copy_on_one_rank(in, out, stream);
  }
  if (completes_in_stream_order(comm, in))
    (void)comm.all_gather_async(in, out, stream);
  else
    comm.all_gather(in, out, stream);
}

void reduce_scatter_in_stream_order(Communicator& comm, const TensorView& in, const TensorView& out,
                                    Stream stream) {
  if (comm.size() == 1) {
    comm_check::reduce_scatter_args(in, out, 1);
    return copy_on_one_rank(in, out, stream);
  }
  if (completes_in_stream_order(comm, in))
    (void)comm.reduce_scatter_async(in, out, ReduceOp::kSum, stream);
  else
    comm.reduce_scatter(in, out, ReduceOp::kSum, stream);
}

}  // namespace qmesh
