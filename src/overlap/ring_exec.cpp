#include "ring_exec.h"

#include <algorithm>
#include <cstring>

#include "qmesh/copy.h"
#include "qmesh/error.h"
#include "ring_device.h"

namespace qmesh::overlap_detail {

namespace {

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

}  // namespace

void check_device(const Device& device, const CollectiveGemmStreams& streams, const char* op) {
  if (!device.is_cuda()) return;
  require_device(device);
  require_two_streams(streams.compute, streams.comm, op);
}

std::optional<DeviceGuard> make_current(const Device& device) {
  if (!device.is_cuda()) return std::nullopt;
  return std::optional<DeviceGuard>(std::in_place, device.index);
}

const TensorView& operand_data(const GemmOperand& op) { return op.stored(); }

GemmOperand operand_rows(const GemmOperand& op, int64_t begin, int64_t count) {
  if (!op.is_quantized()) return GemmOperand::plain(op.tensor.rows(begin, begin + count));
  QuantizedTensorView q = op.quantized;
  q.data = q.data.rows(begin, begin + count);
  q.data_t = TensorView();
  return GemmOperand::fp8(q);
}

void check_gathered(const GemmOperand& chunk, const GemmOperand& gathered, int comm_size,
                    const char* op, const char* chunk_name) {
  const TensorView& c = operand_data(chunk);
  const TensorView& g = operand_data(gathered);
  auto kind = [](const GemmOperand& o) {
    return o.is_block_scaled() ? (o.block.block == BlockShape::k1x128 ? "1x128-block-scaled FP8 "
                                                                      : "128x128-block-scaled FP8 ")
           : o.is_quantized()  ? "FP8 "
                               : "";
  };
  QMESH_CHECK(std::string_view(kind(chunk)) == kind(gathered) && c.dtype == g.dtype, op,
              ": gathered must be of ", chunk_name, "'s kind and dtype ", kind(chunk),
              dtype_name(c.dtype), ", got ", kind(gathered), dtype_name(g.dtype));
  QMESH_CHECK(c.device == g.device, op, ": ", chunk_name, " is on ", c.device.str(),
              " and gathered on ", g.device.str(), "; both must be on one device");
  QMESH_CHECK(g.shape.rows() == comm_size * c.shape.rows() && g.shape.cols() == c.shape.cols(), op,
              ": gathered must be [", comm_size * c.shape.rows(), ", ", c.shape.cols(),
              "] (tp=", comm_size, " chunks of ", c.shape.str(), "), got ", g.shape.str());
  const char* c_begin = static_cast<const char*>(c.data);
  const char* g_begin = static_cast<const char*>(g.data);
  QMESH_CHECK(c_begin + c.nbytes() <= g_begin || g_begin + g.nbytes() <= c_begin, op, ": ",
              chunk_name, " must not overlap the gathered storage");
}

RingExec::RingExec(Communicator& comm, Device device, const CollectiveGemmStreams& streams,
                   const char* op)
    : comm_(comm),
      cuda_(device.is_cuda()),
      stream_native_(cuda_ && comm.stream_ordered()),
      device_(device),
      streams_(streams),
      what_(detail::concat(op, " (rank ", comm.rank(), " of ", comm.size(), ")")),
      deadline_(comm.timeout()) {}

RingExec::~RingExec() {
  if (!cuda_) return;
  join_streams(streams_.compute, streams_.comm);
  for (void* p : device_scratch_) free_async(p, streams_.compute);
  for (void* e : events_) destroy_event(e);
}

TensorView RingExec::scratch(DType dtype, Shape shape) {
  if (!cuda_) return host_scratch_.emplace_back(dtype, shape).view();
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  device_scratch_.push_back(alloc_async(bytes, streams_.compute));
  start();
  return TensorView(device_scratch_.back(), dtype, shape, device_);
}

void RingExec::start() {
  if (cuda_) wait_event(streams_.comm, computed());
}

RingExec::Mark RingExec::computed() { return cuda_ ? mark(streams_.compute) : nullptr; }

void RingExec::compute_after(Mark m) {
  if (m) wait_event(streams_.compute, m);
}

WorkHandle RingExec::recv(const TensorView& buf, int peer, int tag, Mark after) {
  if (after) wait_event(streams_.comm, after);
  return track(comm_.recv_async(buf, peer, tag, streams_.comm));
}

WorkHandle RingExec::send(const TensorView& buf, int peer, int tag, Mark after) {
  if (after) wait_event(streams_.comm, after);
  return track(comm_.send_async(buf, peer, tag, streams_.comm));
}

RingExec::Exchange RingExec::exchange(const TensorView& out, int to, Mark out_ready,
                                      const TensorView& in, int from, Mark in_free, int tag) {
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

WorkHandle RingExec::all_gather_async(const TensorView& in, const TensorView& out) {
  return track(comm_.all_gather_async(in, out, streams_.comm));
}

void RingExec::wait(WorkHandle& work, int step, std::string_view what) {
  if (!work) return;
  untrack(work.get());
  try {
    work->wait(deadline_.left());
  } catch (const Error& e) {
    work.reset();
    abandon();
    QMESH_THROW_KIND(e.kind(), what_, " failed at step ", step, " (", what, "): ", e.what());
  }
  work.reset();
}

RingExec::Mark RingExec::finish(WorkHandle& work, int step, std::string_view what) {
  if (stream_native_) {
    untrack(work.get());
    work.reset();  // stream-ordered: dropping the handle does not block
  } else {
    wait(work, step, what);
  }
  return cuda_ ? mark(streams_.comm) : nullptr;
}

RingExec::Mark RingExec::all_gather(const TensorView& in, const TensorView& out, int step,
                                    std::string_view what) {
  WorkHandle work = all_gather_async(in, out);
  return finish(work, step, what);
}

void RingExec::abandon() noexcept {
  for (Work* w : in_flight_) {
    try {
      w->wait(std::chrono::milliseconds(0));
    } catch (const Error&) {  // abandoned: the first error is the one reported
    }
  }
  in_flight_.clear();
}

std::vector<float> RingExec::gather_scalar(float* value) {
  const int n = comm_.size();
  std::vector<float> out(static_cast<size_t>(n));
  WorkHandle work = all_gather_async(TensorView(value, DType::kFloat32, Shape{1}, device_),
                                     TensorView(out.data(), DType::kFloat32, Shape{n}));
  wait(work, 0, "scale_inv all-gather");
  return out;
}

const float* RingExec::gather_scalar_on_device(float* value, Mark& ready) {
  const int n = comm_.size();
  const TensorView gathered = scratch(DType::kFloat32, Shape{n});
  ready = all_gather(TensorView(value, DType::kFloat32, Shape{1}, device_), gathered, 0,
                     "scale_inv all-gather");
  return gathered.data_as<float>();
}

void RingExec::poison_unless_same_scales(const float* scales, int rank, const TensorView& d,
                                         float* amax) {
  poison_unless_same_async(scales, comm_.size(), rank, d.data, d.numel(),
                           static_cast<int>(dtype_size(d.dtype)), nan_bits(d.dtype), amax,
                           streams_.compute);
}

void RingExec::max_of(float* out, const float* in, int n, int stride) {
  if (cuda_) {
    max_fp32_async(out, in, n, stride, streams_.compute);
    return;
  }
  float m = in[0];
  for (int i = 1; i < n; ++i) {
    const float v = in[i * stride];
    m = (v > m || v != v) ? v : m;
  }
  *out = m;
}

void RingExec::gemm(const GemmArgs& args) { qmesh::gemm(args, streams_.compute); }

void RingExec::add(const TensorView& out, const TensorView& a, const TensorView& b) {
  const int64_t count = out.numel();
  if (cuda_) {
    add_fp32_async(out.data_as<float>(), a.data_as<float>(), b.data_as<float>(), count,
                   streams_.compute);
    return;
  }
  float* t = out.data_as<float>();
  const float* x = a.data_as<float>();
  const float* y = b.data_as<float>();
  for (int64_t i = 0; i < count; ++i) t[i] = x[i] + y[i];
}

void RingExec::copy(void* dst, const void* src, size_t bytes) {
  if (cuda_)
    copy_async(dst, src, bytes, streams_.compute);
  else
    std::memcpy(dst, src, bytes);
}

void RingExec::copy_2d(void* dst, size_t dst_pitch, const void* src, size_t src_pitch, size_t width,
                       size_t height) {
  copy_rows_async(dst, dst_pitch, device_, src, src_pitch, device_, width, height,
                  cuda_ ? streams_.compute : Stream{});
}

void RingExec::zero(const TensorView& t) {
  if (cuda_)
    zero_async(t.data, t.nbytes(), streams_.compute);
  else
    std::memset(t.data, 0, t.nbytes());
}

void RingExec::copy_scalars(const QuantizedTensorView& from, const QuantizedTensorView& to) {
  auto copy_one = [&](float* dst, const float* src) {
    if (dst && src) copy(dst, src, sizeof(float));
  };
  copy_one(to.scale, from.scale);
  copy_one(to.scale_inv, from.scale_inv);
  copy_one(to.amax, from.amax);
}

WorkHandle RingExec::track(WorkHandle work) {
  if (work) in_flight_.push_back(work.get());
  return work;
}

void RingExec::untrack(const Work* work) { std::erase(in_flight_, work); }

RingExec::Mark RingExec::mark(Stream stream) {
  events_.push_back(nullptr);
  events_.back() = record_event(stream);
  return events_.back();
}

}  // namespace qmesh::overlap_detail
