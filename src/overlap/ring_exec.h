// The one executor of the overlap schedules (internal to src/overlap): the collective-GEMM
// rings and OperandGather run their transfers, GEMMs, sums and copies through a RingExec, so
// that each schedule is written once for host and CUDA tensors.
//
// Host: a GEMM, sum or copy is computed before the call returns; the host waits for every
// transfer. CUDA: GEMMs, sums and copies are enqueued on streams.compute, transfers on
// streams.comm; a Mark (a CUDA event) recorded on one stream orders work on the other. The
// host waits for a transfer only when the backend completes it on the host (everything but
// NCCL: the local backend copies device buffers when both sides have posted); NCCL's
// transfers complete in stream order, so nothing blocks the host. When a RingExec ends, the
// compute stream is made to wait for the comm stream (so that later work on it sees every
// transfer finished) and the scratch memory is released in its order.
//
// Every host wait of one RingExec is bounded by one deadline, the communicator's timeout()
// after it was made, so that a dead peer ends a schedule after that long whatever its number
// of steps.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/comm/deadline.h"
#include "qmesh/device.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/overlap/collective_gemm.h"

namespace qmesh::overlap_detail {

// A schedule on CUDA `device`: Error unless the device is usable and `streams` are two
// distinct streams (named by `op`). Nothing to check on the host.
void check_device(const Device& device, const CollectiveGemmStreams& streams, const char* op);
// The CUDA device of `device` made current for the scope of the result; nothing on the host.
std::optional<DeviceGuard> make_current(const Device& device);

// The codes of an FP8 operand (per-tensor or block-scaled), else its tensor.
const TensorView& operand_data(const GemmOperand& op);
// Rows of a plain or per-tensor FP8 operand (FP8: rowwise codes only; the scalars are shared).
GemmOperand operand_rows(const GemmOperand& op, int64_t begin, int64_t count);

// The checks shared by everything that gathers `chunk` ([T_local, K], this rank's rows) into
// `gathered` ([comm_size * T_local, K]): the same kind and dtype, the same device, that shape,
// and no overlap of the two (block-scaled operands: both block-scaled, same block shape). `op` and
// `chunk_name` ("A", "the chunk") name them in the Error.
void check_gathered(const GemmOperand& chunk, const GemmOperand& gathered, int comm_size,
                    const char* op, const char* chunk_name);

class RingExec {
 public:
  using Mark = void*;  // nullptr on the host and for "nothing to wait for"
  // The two transfers of a ring step (either may be absent).
  struct Exchange {
    WorkHandle send, recv;
  };

  // `device` holds every tensor of the schedule; the caller keeps it current (make_current)
  // while it uses the RingExec. Describes itself as "<op> (rank r of n)".
  RingExec(Communicator& comm, Device device, const CollectiveGemmStreams& streams, const char* op);
  ~RingExec();
  RingExec(const RingExec&) = delete;
  RingExec& operator=(const RingExec&) = delete;

  Device device() const { return device_; }
  bool on_cuda() const { return cuda_; }
  // "<op> (rank r of n)", the opening of its errors.
  const std::string& what() const { return what_; }

  // Scratch memory that lives until the RingExec ends. CUDA: allocated in the compute
  // stream's order, and the comm stream is ordered after the allocation.
  TensorView scratch(DType dtype, Shape shape);
  // CUDA: the comm stream waits for what the compute stream holds so far (the work that
  // produced the schedule's inputs). Call before the first transfer.
  void start();
  // A mark after the work enqueued on the compute stream so far (nullptr on the host).
  Mark computed();
  // Work enqueued on the compute stream from now on waits for `m`.
  void compute_after(Mark m);
  // Host: post (the transfers), then compute (blocking GEMMs). CUDA: compute first (only
  // enqueued), then post: a backend that copies on the posting thread then copies while
  // the GEMM runs.
  template <class Post, class Compute>
  void in_order(Post&& post, Compute&& compute) {
    if (cuda_) {
      compute();
      post();
    } else {
      post();
      compute();
    }
  }

  // Transfers on the comm stream, after `after` (a mark of the data they read or of the last
  // reader of the buffer they overwrite).
  WorkHandle recv(const TensorView& buf, int peer, int tag, Mark after = nullptr);
  WorkHandle send(const TensorView& buf, int peer, int tag, Mark after = nullptr);
  // One ring step's send of `out` to `to` (after out_ready) and receive of `in` from `from`
  // (after in_free); an empty view is no transfer. Even ranks send first and odd ranks
  // receive first: NCCL runs one communicator's operations one after another, each send
  // holding until its receive runs, and this order pairs them on every ring, odd sizes
  // included (the other backends post without blocking, so the order does not matter there).
  Exchange exchange(const TensorView& out, int to, Mark out_ready, const TensorView& in, int from,
                    Mark in_free, int tag);
  // An all-gather on the comm stream, started now and ended with finish().
  WorkHandle all_gather_async(const TensorView& in, const TensorView& out);

  // The host waits for a transfer, bounded by the deadline. When it fails (a dead or stuck
  // peer), the other transfers still in flight are abandoned (see abandon()) and the Error
  // names this schedule, `step` and `what`.
  void wait(WorkHandle& work, int step, std::string_view what);
  // Ends a transfer: the host waits for it (as wait()) unless it completes in stream order;
  // CUDA: returns a mark after it on the comm stream.
  Mark finish(WorkHandle& work, int step, std::string_view what);
  // An all-gather on the comm stream, waited for as finish() waits.
  Mark all_gather(const TensorView& in, const TensorView& out, int step, std::string_view what);
  // The transfers still in flight get what is left of the deadline, which is nothing, so that
  // dropping them does not wait a further timeout each (after a failure, or when unwinding).
  // Call while their WorkHandles live.
  void abandon() noexcept;

  // Host tensors: every rank's fp32 scalar `value`, in rank order (blocking).
  std::vector<float> gather_scalar(float* value);
  // CUDA: every rank's fp32 scalar `value` gathered into device scratch [n] on the comm
  // stream (no host wait when the backend is stream-ordered); returns the scratch and sets
  // `ready` to the mark after the gather.
  const float* gather_scalar_on_device(float* value, Mark& ready);
  // CUDA, on the compute stream: unless every entry of `scales` [n] equals scales[rank], D
  // (contiguous) is filled with NaN in its dtype and *amax (if not null) set to NaN: the
  // device-side check that every rank quantized with the same scale, which never waits.
  void poison_unless_same_scales(const float* scales, int rank, const TensorView& d, float* amax);
  // *out = the NaN-propagating max of in[i * stride] for i < n (host: now; CUDA: on the
  // compute stream).
  void max_of(float* out, const float* in, int n, int stride);

  void gemm(const GemmArgs& args);
  // out = a + b, element-wise in fp32 (the three are [rows, cols] fp32).
  void add(const TensorView& out, const TensorView& a, const TensorView& b);
  void copy(void* dst, const void* src, size_t bytes);
  // `height` rows of `width` bytes, row i from src + i * src_pitch to dst + i * dst_pitch.
  void copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
               size_t height);
  // Every byte of `t` (contiguous) becomes 0.
  void zero(const TensorView& t);
  // `to` takes the scale, scale_inv and amax of `from` (each where both have one).
  void copy_scalars(const QuantizedTensorView& from, const QuantizedTensorView& to);

 private:
  WorkHandle track(WorkHandle work);
  void untrack(const Work* work);
  Mark mark(Stream stream);

  Communicator& comm_;
  bool cuda_;
  bool stream_native_;
  Device device_;
  CollectiveGemmStreams streams_;
  std::string what_;
  Deadline deadline_;
  std::deque<Tensor> host_scratch_;
  std::vector<void*> device_scratch_;
  std::vector<void*> events_;
  std::vector<Work*> in_flight_;  // posted transfers not yet finished
};

}  // namespace qmesh::overlap_detail
