#include "qmesh/overlap/collective_gemm.h"

#include <chrono>
#include <cstring>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "qmesh/device.h"
#include "qmesh/error.h"
#include "ring_device.h"

namespace qmesh {

namespace {

using Clock = std::chrono::steady_clock;

// Tags of the rings' point-to-point messages (a communicator must not carry other traffic
// with these tags while a collective GEMM runs).
constexpr int kTagRight = 0x5100;  // chunks moving to rank + 1
constexpr int kTagLeft = 0x5101;   // chunks moving to rank - 1
constexpr int kTagScaleRight = 0x5102;
constexpr int kTagScaleLeft = 0x5103;
constexpr int kTagPartial = 0x5104;  // partial sums of the reduce-scatter ring

// Rows [begin, begin + count) of a row-major 2-D host tensor.
TensorView rows_of(const TensorView& t, int64_t begin, int64_t count) {
  const int64_t cols = t.shape.cols();
  auto* base =
      static_cast<char*>(t.data) + begin * cols * static_cast<int64_t>(dtype_size(t.dtype));
  return TensorView(base, t.dtype, Shape{count, cols}, t.device);
}

// The bits of a quiet NaN in `dtype` (FP8: the code 0x7F of docs/numerics.md).
uint32_t nan_bits(DType dtype) {
  switch (dtype_size(dtype)) {
    case 4:
      return 0x7FC00000u;
    case 2:
      return dtype == DType::kFloat16 ? 0x7E00u : 0x7FC0u;
    default:
      return 0x7Fu;
  }
}

const TensorView& operand_data(const GemmOperand& op) {
  return op.is_quantized() ? op.quantized.data : op.tensor;
}

GemmOperand operand_rows(const GemmOperand& op, int64_t begin, int64_t count) {
  if (!op.is_quantized()) return GemmOperand::plain(rows_of(op.tensor, begin, count));
  QuantizedTensorView q = op.quantized;
  q.data = rows_of(q.data, begin, count);
  q.data_t = TensorView();
  return GemmOperand::fp8(q);
}

// One step's GEMM: `a_rows` times B into `d_rows` (and aux rows [begin, begin + count) when
// the epilogue uses aux).

// Waits bounded by one deadline for the whole collective, so that a dead peer ends it after
// comm_timeout() whatever the number of steps.
class Waiter {
 public:
  explicit Waiter(std::string what)
      : what_(std::move(what)), deadline_(Clock::now() + comm_timeout()) {}

  void wait(WorkHandle& work, int step, std::string_view transfer) const {
    if (!work) return;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now());
    try {
      work->wait(std::max(left, std::chrono::milliseconds(0)));
    } catch (const Error& e) {
      QMESH_THROW(what_, " failed at step ", step, " (", transfer, "): ", e.what());
    }
    work.reset();
  }
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  Clock::time_point deadline_;
};

std::string describe(const char* op, const Communicator& comm) {
  return std::string(op) + " (rank " + std::to_string(comm.rank()) + " of " +
         std::to_string(comm.size()) + ")";
}

// Where a ring's pieces run, so that each schedule is written once for both places.
// Host: a GEMM or a sum is computed before the call returns; the host waits for every
// transfer. CUDA: GEMMs, sums and copies are enqueued on streams.compute, transfers on
// streams.comm; a Mark (a CUDA event) recorded on one stream orders work on the other. The
// host waits for a transfer only when the backend completes it on the host (everything but
// NCCL: the local backend copies device buffers when both sides have posted); NCCL's
// transfers complete in stream order, so nothing in the ring blocks the host. On every exit
// the compute stream is made to wait for the comm stream (so that later work on it sees
// every transfer finished) and the scratch memory is released in its order.
class RingExec {
 public:
  using Mark = void*;  // nullptr on the host and for "nothing to wait for"
  // The two transfers of a ring step (either may be absent).
  struct Exchange {
    WorkHandle send, recv;
  };

  RingExec(Communicator& comm, Device device, const CollectiveGemmStreams& streams,
           std::string what)
      : comm_(comm),
        cuda_(device.is_cuda()),
        stream_native_(cuda_ && comm.stream_ordered()),
        device_(device),
        streams_(streams),
        waiter_(std::move(what)) {
    if (cuda_) current_device_.emplace(device.index);
  }
  ~RingExec() {
    if (!cuda_) return;
    overlap_detail::join_streams(streams_.compute, streams_.comm);
    for (void* p : device_scratch_) overlap_detail::free_async(p, streams_.compute);
    for (void* e : events_) overlap_detail::destroy_event(e);
  }
  RingExec(const RingExec&) = delete;
  RingExec& operator=(const RingExec&) = delete;

  bool on_cuda() const { return cuda_; }
  const Waiter& waiter() const { return waiter_; }

  // Scratch memory that lives until the ring ends. CUDA: allocated in the compute stream's
  // order, and the comm stream is ordered after the allocation.
  TensorView scratch(DType dtype, Shape shape) {
    if (!cuda_) return host_scratch_.emplace_back(dtype, shape).view();
    const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    device_scratch_.push_back(overlap_detail::alloc_async(bytes, streams_.compute));
    start();
    return TensorView(device_scratch_.back(), dtype, shape, device_);
  }
  // CUDA: the comm stream waits for what the compute stream holds so far (the work that
  // produced the call's inputs). Call before the first transfer.
  void start() {
    if (cuda_) overlap_detail::wait_event(streams_.comm, computed());
  }
  // A mark after the work enqueued on the compute stream so far (nullptr on the host).
  Mark computed() { return cuda_ ? mark(streams_.compute) : nullptr; }
  // Work enqueued on the compute stream from now on waits for `m`.
  void compute_after(Mark m) {
    if (m) overlap_detail::wait_event(streams_.compute, m);
  }
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
  // A transfer on the comm stream, after `after` (a mark of the data it reads or of the last
  // reader of the buffer it overwrites).
  WorkHandle recv(const TensorView& buf, int peer, int tag, Mark after = nullptr) {
    if (after) overlap_detail::wait_event(streams_.comm, after);
    return track(comm_.recv_async(buf, peer, tag, streams_.comm));
  }
  WorkHandle send(const TensorView& buf, int peer, int tag, Mark after = nullptr) {
    if (after) overlap_detail::wait_event(streams_.comm, after);
    return track(comm_.send_async(buf, peer, tag, streams_.comm));
  }
  // The host waits for a transfer, bounded by the call's deadline. When it fails (a dead or
  // stuck peer), the ring's other transfers still in flight get what is left of that
  // deadline, which is nothing, so that dropping them does not wait a further
  // comm_timeout() each; then the error is thrown.
  void wait(WorkHandle& work, int step, std::string_view what) {
    if (!work) return;
    untrack(work.get());
    try {
      waiter_.wait(work, step, what);
    } catch (const Error&) {
      for (Work* w : in_flight_) {
        try {
          w->wait(std::chrono::milliseconds(0));
        } catch (const Error&) {  // abandoned: the first error is the one reported
        }
      }
      in_flight_.clear();
      throw;
    }
  }
  // One ring step's send of `out` to `to` (after out_ready) and receive of `in` from `from`
  // (after in_free); an empty view is no transfer. Even ranks send first and odd ranks
  // receive first: NCCL runs one communicator's operations one after another, each send
  // holding until its receive runs, and this order pairs them on every ring, odd tp included
  // (the other backends post without blocking, so the order does not matter there).
  Exchange exchange(const TensorView& out, int to, Mark out_ready, const TensorView& in, int from,
                    Mark in_free, int tag) {
    Exchange x;
    auto post_send = [&] {
      if (!out.empty()) x.send = send(out, to, tag, out_ready);
    };
    auto post_recv = [&] {
      if (!in.empty()) x.recv = recv(in, from, tag, in_free);
    };
    if (comm_.rank() % 2 == 0) {
      post_send();
      post_recv();
    } else {
      post_recv();
      post_send();
    }
    return x;
  }
  // Ends a transfer: the host waits for it (bounded by the call's deadline) unless it
  // completes in stream order; CUDA: returns a mark after it on the comm stream.
  Mark finish(WorkHandle& work, int step, std::string_view what) {
    if (stream_native_) {
      untrack(work.get());
      work.reset();  // stream-ordered: dropping the handle does not block
    } else {
      wait(work, step, what);
    }
    return cuda_ ? mark(streams_.comm) : nullptr;
  }
  // A collective on the comm stream, ended like a transfer.
  Mark all_gather(const TensorView& in, const TensorView& out, int step, std::string_view what) {
    WorkHandle work = comm_.all_gather_async(in, out, streams_.comm);
    return finish(work, step, what);
  }
  // Host tensors: every rank's fp32 scalar `value`, in rank order (blocking).
  std::vector<float> gather_scalar(float* value) {
    const int n = comm_.size();
    std::vector<float> out(static_cast<size_t>(n));
    const TensorView in(value, DType::kFloat32, Shape{1}, device_);
    WorkHandle work = comm_.all_gather_async(in, TensorView(out.data(), DType::kFloat32, Shape{n}),
                                             streams_.comm);
    waiter_.wait(work, 0, "scale_inv all-gather");
    return out;
  }
  // CUDA: every rank's fp32 scalar `value` gathered into device scratch [n] on the comm
  // stream (no host wait when the backend is stream-ordered); returns the scratch and sets
  // `ready` to the mark after the gather.
  const float* gather_scalar_on_device(float* value, Mark& ready) {
    const int n = comm_.size();
    const TensorView gathered = scratch(DType::kFloat32, Shape{n});
    ready = all_gather(TensorView(value, DType::kFloat32, Shape{1}, device_), gathered, 0,
                       "scale_inv all-gather");
    return gathered.data_as<float>();
  }
  // CUDA, on the compute stream: unless every entry of `scales` [n] equals scales[rank], D
  // (contiguous) is filled with NaN in its dtype and *amax (if not null) set to NaN: the
  // device-side form of check_same_scales, which never waits.
  void poison_unless_same_scales(const float* scales, int rank, const TensorView& d, float* amax) {
    overlap_detail::poison_unless_same_async(scales, comm_.size(), rank, d.data, d.numel(),
                                             static_cast<int>(dtype_size(d.dtype)),
                                             nan_bits(d.dtype), amax, streams_.compute);
  }
  // *out = the NaN-propagating max of in[0..n) (host: now; CUDA: on the compute stream).
  void max_of(float* out, const float* in, int n) {
    if (cuda_) {
      overlap_detail::max_fp32_async(out, in, n, streams_.compute);
      return;
    }
    float m = in[0];
    for (int i = 1; i < n; ++i) m = (in[i] > m || in[i] != in[i]) ? in[i] : m;
    *out = m;
  }

  void gemm(const GemmArgs& args) { qmesh::gemm(args, streams_.compute); }
  // out = a + b, element-wise in fp32 (the three are [rows, cols] fp32).
  void add(const TensorView& out, const TensorView& a, const TensorView& b) {
    const int64_t count = out.numel();
    if (cuda_) {
      overlap_detail::add_fp32_async(out.data_as<float>(), a.data_as<float>(), b.data_as<float>(),
                                     count, streams_.compute);
      return;
    }
    float* t = out.data_as<float>();
    const float* x = a.data_as<float>();
    const float* y = b.data_as<float>();
    for (int64_t i = 0; i < count; ++i) t[i] = x[i] + y[i];
  }
  void copy(void* dst, const void* src, size_t bytes) {
    if (cuda_)
      overlap_detail::copy_async(dst, src, bytes, streams_.compute);
    else
      std::memcpy(dst, src, bytes);
  }

 private:
  WorkHandle track(WorkHandle work) {
    if (work) in_flight_.push_back(work.get());
    return work;
  }
  void untrack(const Work* work) { std::erase(in_flight_, work); }

  Mark mark(Stream stream) {
    events_.push_back(nullptr);
    events_.back() = overlap_detail::record_event(stream);
    return events_.back();
  }

  Communicator& comm_;
  bool cuda_;
  bool stream_native_;
  Device device_;
  CollectiveGemmStreams streams_;
  Waiter waiter_;
  std::optional<DeviceGuard> current_device_;
  std::deque<Tensor> host_scratch_;
  std::vector<void*> device_scratch_;
  std::vector<void*> events_;
  std::vector<Work*> in_flight_;  // posted transfers not yet finished
};

// All tensors on A's device; CUDA tensors need the two streams.
Device check_common(const GemmArgs& args, const CollectiveGemmStreams& streams, const char* op) {
  QMESH_CHECK(args.trans_a == GemmTranspose::kNo, op,
              ": A must be stored [tokens, K] (trans_a kNo), got trans_a kYes");
  const Device device = args.a.device();
  QMESH_CHECK(args.d.device == device, op, ": A is on ", device.str(), " and D on ",
              args.d.device.str(), "; a collective GEMM's tensors live on one device");
  QMESH_CHECK(args.epilogue != GemmEpilogue::kBiasGrad, op,
              ": the kBiasGrad epilogue sums over the token chunks and cannot be split");
  if (device.is_cuda()) {
    require_device(device);
    overlap_detail::require_two_streams(streams.compute, streams.comm, op);
  }
  return device;
}

void check_gemm(const GemmArgs& probe, const char* op) {
  const Status st = Gemm::can_implement(probe);
  QMESH_CHECK(st.ok(), op, ": ", st.reason());
}

void check_same_scales(const std::vector<float>& scales, int rank, const std::string& what) {
  for (size_t p = 0; p < scales.size(); ++p)
    QMESH_CHECK(scales[p] == scales[static_cast<size_t>(rank)], what, ": rank ", p,
                "'s FP8 scale_inv ", scales[p], " differs from this rank's ",
                scales[static_cast<size_t>(rank)],
                "; reduce the amax over the tensor-parallel group before quantizing");
}

int mod(int x, int n) { return ((x % n) + n) % n; }

// One step's GEMM: `a_rows` times B into `d_rows` (and aux rows [begin, begin + count) when
// the epilogue uses aux).
void gemm_rows(RingExec& exec, const GemmArgs& args, const GemmOperand& a_rows,
               const TensorView& d_rows, int64_t begin, int64_t count) {
  GemmArgs step = args;
  step.a = a_rows;
  step.d = d_rows;
  if (!args.aux.empty()) step.aux = rows_of(args.aux, begin, count);
  exec.gemm(step);
}

}  // namespace

std::string_view overlap_name(Overlap overlap) {
  switch (overlap) {
    case Overlap::kNone:
      return "none";
    case Overlap::kRing:
      return "ring";
    case Overlap::kBidirectional:
      return "bidir";
  }
  QMESH_THROW("overlap_name: unknown Overlap value ", int(overlap));
}

Overlap parse_overlap(std::string_view name) {
  for (Overlap o : {Overlap::kNone, Overlap::kRing, Overlap::kBidirectional})
    if (overlap_name(o) == name) return o;
  QMESH_THROW("unknown overlap '", name, "'; expected one of: none, ring, bidir");
}

void all_gather_gemm(Communicator& comm, const GemmArgs& args, const GemmOperand& gathered,
                     Overlap overlap, const CollectiveGemmStreams& streams) {
  const char* op = "all_gather_gemm";
  const Device device = check_common(args, streams, op);
  const int n = comm.size(), r = comm.rank();
  const TensorView& a = operand_data(args.a);
  const TensorView& g = operand_data(gathered);
  const int64_t chunk = a.shape.rows(), k = a.shape.cols(), tokens = chunk * n;
  QMESH_CHECK(gathered.is_quantized() == args.a.is_quantized() && g.dtype == a.dtype, op,
              ": gathered must have A's dtype ", dtype_name(a.dtype), ", got ",
              dtype_name(g.dtype));
  QMESH_CHECK(g.device == device, op, ": gathered must be on A's device ", device.str(), ", got ",
              g.device.str());
  QMESH_CHECK(!gathered.is_quantized() || !gathered.quantized.has_columnwise(), op,
              ": gathered FP8 storage must not have a columnwise copy (it receives rowwise "
              "chunks only)");
  QMESH_CHECK(g.shape.rows() == tokens && g.shape.cols() == k, op, ": gathered must be [", tokens,
              ", ", k, "] (tp=", n, " chunks of A ", a.shape.str(), "), got ", g.shape.str());
  QMESH_CHECK(args.d.shape.rows() == tokens, op, ": D must have ", tokens, " rows (tp=", n, " x ",
              chunk, " tokens), got shape ", args.d.shape.str());
  QMESH_CHECK(!args.aux.empty() || (args.epilogue != GemmEpilogue::kBiasGeluAux &&
                                    args.epilogue != GemmEpilogue::kDGelu),
              op, ": the epilogue needs aux");
  QMESH_CHECK(args.aux.empty() || args.aux.shape.rows() == tokens, op, ": aux must have ", tokens,
              " rows, got shape ", args.aux.shape.str());
  {  // B, the epilogue and D's columns are checked on the first chunk, before any transfer.
    GemmArgs probe = args;
    probe.d = rows_of(args.d, 0, chunk);
    if (!args.aux.empty()) probe.aux = rows_of(args.aux, 0, chunk);
    check_gemm(probe, op);
  }
  const char* a_begin = static_cast<const char*>(a.data);
  const char* g_begin = static_cast<const char*>(g.data);
  QMESH_CHECK(a_begin + a.nbytes() <= g_begin || g_begin + g.nbytes() <= a_begin, op,
              ": A must not overlap the gathered storage");
  RingExec exec(comm, device, streams, describe(op, comm));
  exec.start();
  const bool fp8 = gathered.is_quantized();
  // The scales must agree over the group. Host: kNone checks them with an all-gather, the
  // rings with the neighbours' values at step 0 (an error either way). CUDA: a device-side
  // check after the GEMMs fills D with NaN instead, so that the host never waits for the
  // device (include/qmesh/overlap/collective_gemm.h).
  const bool gather_scales = fp8 && n > 1 && !exec.on_cuda() && overlap == Overlap::kNone;
  if (gather_scales) check_same_scales(exec.gather_scalar(args.a.quantized.scale_inv), r, op);
  RingExec::Mark scales_ready = nullptr;
  const float* device_scales =
      fp8 && n > 1 && exec.on_cuda()
          ? exec.gather_scalar_on_device(args.a.quantized.scale_inv, scales_ready)
          : nullptr;
  if (fp8) {
    const QuantizedTensorView& qa = args.a.quantized;
    const QuantizedTensorView& qg = gathered.quantized;
    exec.copy(qg.scale, qa.scale, sizeof(float));
    exec.copy(qg.scale_inv, qa.scale_inv, sizeof(float));
    if (qg.amax && qa.amax) exec.copy(qg.amax, qa.amax, sizeof(float));
  }
  // An FP8 D's amax is the max over the chunks' (docs/numerics.md "FP8 GEMM output amax"):
  // each chunk's GEMM writes its own, combined after the last one.
  float* chunk_amax =
      args.d_amax && n > 1 ? exec.scratch(DType::kFloat32, Shape{n}).data_as<float>() : nullptr;
  // arrived[c]: the mark after which chunk c is in `gathered`.
  std::vector<RingExec::Mark> arrived(static_cast<size_t>(n), nullptr);
  auto slot = [&](int c) { return rows_of(g, c * chunk, chunk); };
  auto chunk_gemm = [&](int c) {
    exec.compute_after(arrived[static_cast<size_t>(c)]);
    GemmArgs step = args;
    if (chunk_amax) step.d_amax = chunk_amax + c;
    gemm_rows(exec, step, operand_rows(gathered, c * chunk, chunk),
              rows_of(args.d, c * chunk, chunk), c * chunk, chunk);
  };
  if (overlap == Overlap::kNone || n == 1) {
    const RingExec::Mark all = exec.all_gather(a, g, 0, "all-gather");
    for (int c = 0; c < n; ++c) {
      arrived[static_cast<size_t>(c)] = all;
      chunk_gemm(c);
    }
  } else {
    exec.copy(slot(r).data, a.data, a.nbytes());
    arrived[static_cast<size_t>(r)] = exec.computed();
    // Chunks moving right (from rank - 1) and left (from rank + 1): h_right + h_left = n - 1.
    const int h_right = overlap == Overlap::kRing ? n - 1 : n / 2;
    const int h_left = n - 1 - h_right;
    const int next = mod(r + 1, n), prev = mod(r - 1, n);
    const bool exchange_scales = fp8 && !exec.on_cuda();
    float scale_from_prev = 0, scale_from_next = 0;
    TensorView scale_prev_view(&scale_from_prev, DType::kFloat32, Shape{1});
    TensorView scale_next_view(&scale_from_next, DType::kFloat32, Shape{1});
    for (int s = 0; s <= h_right; ++s) {
      RingExec::Exchange right, left;
      WorkHandle scale_works[4];
      const int right_in = mod(r - s - 1, n), right_out = mod(r - s, n);
      const int left_in = mod(r + s + 1, n), left_out = mod(r + s, n);
      auto post = [&] {
        if (s < h_right)
          right = exec.exchange(slot(right_out), next, arrived[static_cast<size_t>(right_out)],
                                slot(right_in), prev, nullptr, kTagRight);
        if (s < h_left)
          left = exec.exchange(slot(left_out), prev, arrived[static_cast<size_t>(left_out)],
                               slot(left_in), next, nullptr, kTagLeft);
        if (s == 0 && exchange_scales) {  // host tensors only
          const TensorView mine(args.a.quantized.scale_inv, DType::kFloat32, Shape{1});
          scale_works[0] = exec.recv(scale_prev_view, prev, kTagScaleRight);
          scale_works[1] = exec.send(mine, next, kTagScaleRight);
          scale_works[2] = exec.recv(scale_next_view, next, kTagScaleLeft);
          scale_works[3] = exec.send(mine, prev, kTagScaleLeft);
        }
      };
      auto compute = [&] {
        chunk_gemm(right_out);
        if (s >= 1 && s <= h_left) chunk_gemm(left_out);
      };
      exec.in_order(post, compute);
      if (s < h_right) {
        exec.finish(right.send, s, "send to the next rank");
        arrived[static_cast<size_t>(right_in)] =
            exec.finish(right.recv, s, "receive from the previous rank");
      }
      if (s < h_left) {
        exec.finish(left.send, s, "send to the previous rank");
        arrived[static_cast<size_t>(left_in)] =
            exec.finish(left.recv, s, "receive from the next rank");
      }
      for (WorkHandle& w : scale_works) exec.wait(w, s, "scale_inv exchange");
      if (s == 0 && exchange_scales) {
        const float mine = *args.a.quantized.scale_inv;
        QMESH_CHECK(scale_from_prev == mine && scale_from_next == mine, exec.waiter().what(),
                    ": the neighbours' FP8 scale_inv (", scale_from_prev, ", ", scale_from_next,
                    ") differ from this rank's ", mine,
                    "; reduce the amax over the tensor-parallel group before quantizing");
      }
    }
  }
  if (chunk_amax) exec.max_of(args.d_amax, chunk_amax, n);
  if (device_scales) {
    exec.compute_after(scales_ready);
    exec.poison_unless_same_scales(device_scales, r, args.d, args.d_amax);
  }
}

void gemm_reduce_scatter(Communicator& comm, const GemmArgs& args, Overlap overlap,
                         const CollectiveGemmStreams& streams) {
  const char* op = "gemm_reduce_scatter";
  const Device device = check_common(args, streams, op);
  QMESH_CHECK(args.epilogue == GemmEpilogue::kNone && args.output == GemmOutputMode::kWrite, op,
              ": partial sums take no epilogue and no accumulation (got epilogue ",
              gemm_epilogue_name(args.epilogue), "); add the bias after the reduction");
  const int n = comm.size(), r = comm.rank();
  const TensorView& a = operand_data(args.a);
  const int64_t tokens = a.shape.rows();
  QMESH_CHECK(tokens % n == 0, op, ": ", tokens, " tokens (rows of A ", a.shape.str(),
              ") are not divisible by tp=", n, "; pad the sequence to a multiple of tp");
  const int64_t chunk = tokens / n, cols = args.d.shape.cols();
  check_dtype(args.d, DType::kFloat32, std::string(op) + " D");
  QMESH_CHECK(args.d.shape.rows() == chunk, op, ": D must have ", chunk, " rows (", tokens,
              " tokens / tp=", n, "), got shape ", args.d.shape.str());
  {
    GemmArgs probe = args;
    probe.a = operand_rows(args.a, 0, chunk);
    check_gemm(probe, op);
  }
  RingExec exec(comm, device, streams, describe(op, comm));
  auto chunk_gemm = [&](int c, const TensorView& into) {
    gemm_rows(exec, args, operand_rows(args.a, c * chunk, chunk), into, 0, chunk);
  };
  if (n == 1) {
    chunk_gemm(0, args.d);
    return;
  }
  const Shape part{chunk, cols};
  // kNone computes every partial first; the reduction is the same ring either way, so that
  // the sums are added in one order on every backend (docs/design/overlap.md).
  TensorView partial;
  if (overlap == Overlap::kNone) {
    partial = exec.scratch(DType::kFloat32, Shape{tokens, cols});
    for (int c = 0; c < n; ++c) chunk_gemm(c, rows_of(partial, c * chunk, chunk));
  }
  // Step s computes this rank's partial of chunk (r - s - 1) mod n and adds the running sum
  // of the same chunk received from rank - 1 (which started it one step earlier); the sum
  // goes on to rank + 1, until at step n - 1 rank r adds its own chunk's last term:
  // chunk c = ((P[c+1] + P[c+2]) + ...) + P[c]. The sum of step s is sent at the start of
  // step s + 1 (CUDA: after that step's GEMM is enqueued). Receive and send buffers
  // alternate (index s % 2), so that a transfer never touches memory being summed into.
  const TensorView mine = exec.scratch(DType::kFloat32, part);
  const TensorView incoming[2] = {exec.scratch(DType::kFloat32, part),
                                  exec.scratch(DType::kFloat32, part)};
  const TensorView outgoing[2] = {exec.scratch(DType::kFloat32, part),
                                  exec.scratch(DType::kFloat32, part)};
  exec.start();
  using Mark = RingExec::Mark;
  // summed[b]: after the last sum that read incoming[b]; sent[b]: after the last send that
  // read outgoing[b].
  Mark summed[2] = {nullptr, nullptr}, sent[2] = {nullptr, nullptr};
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  TensorView pending;  // the sum to send at the start of the next step
  Mark pending_ready = nullptr;
  for (int s = 0; s < n; ++s) {
    const int c = mod(r - s - 1, n), b = s % 2;
    RingExec::Exchange x;
    TensorView own = s == 0 ? outgoing[0] : mine;
    if (overlap == Overlap::kNone) own = rows_of(partial, c * chunk, chunk);
    auto post = [&] {
      x = exec.exchange(pending, next, pending_ready, s > 0 ? incoming[b] : TensorView(), prev,
                        summed[b], kTagPartial);
    };
    auto compute = [&] {
      if (overlap != Overlap::kNone) chunk_gemm(c, own);
    };
    exec.in_order(post, compute);
    TensorView target = own;
    if (s > 0) {
      exec.compute_after(exec.finish(x.recv, s, "receive from the previous rank"));
      target = s == n - 1 ? args.d : outgoing[b];
      exec.compute_after(sent[b]);
      exec.add(target, incoming[b], own);
      summed[b] = exec.computed();
    }
    if (x.send) sent[1 - b] = exec.finish(x.send, s, "send to the next rank");
    pending = s < n - 1 ? target : TensorView();
    pending_ready = s < n - 1 ? exec.computed() : nullptr;
  }
}

}  // namespace qmesh
