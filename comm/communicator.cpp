#include "qmesh/comm/communicator.h"

#include "qmesh/comm/one_sided.h"
#include "qmesh/error.h"

namespace qmesh {

Collectives::~Collectives() = default;
PointToPoint::~PointToPoint() = default;
Communicator::~Communicator() = default;
OneSided::~OneSided() = default;
Window::~Window() = default;

void Window::wait_puts(uint64_t count) { wait_puts(count, comm_timeout()); }

std::chrono::milliseconds Communicator::timeout() const {
  const int64_t ms = timeout_ms_.load(std::memory_order_relaxed);
  return ms > 0 ? std::chrono::milliseconds(ms) : comm_timeout();
}

TimeoutSource Communicator::timeout_source() const {
  return timeout_ms_.load(std::memory_order_relaxed) > 0 ? TimeoutSource::kCommunicator
                                                         : TimeoutSource::kEnvironment;
}

void Communicator::set_timeout(std::optional<std::chrono::milliseconds> timeout) {
  QMESH_CHECK(!timeout || timeout->count() > 0, "communicator timeout of ",
              timeout ? timeout->count() : 0,
              " ms: it must be positive (std::nullopt goes back to QMESH_COMM_TIMEOUT_S)");
  timeout_ms_.store(timeout ? timeout->count() : 0, std::memory_order_relaxed);
}

std::shared_ptr<Communicator> Communicator::with_my_timeout(
    std::shared_ptr<Communicator> child) const {
  if (child) child->timeout_ms_.store(timeout_ms_.load(std::memory_order_relaxed));
  return child;
}

void Collectives::all_reduce(TensorView buf, ReduceOp op, Stream stream) {
  all_reduce_async(buf, op, stream)->wait();
}
void Collectives::all_gather(TensorView in, TensorView out, Stream stream) {
  all_gather_async(in, out, stream)->wait();
}
void Collectives::reduce_scatter(TensorView in, TensorView out, ReduceOp op, Stream stream) {
  reduce_scatter_async(in, out, op, stream)->wait();
}
void Collectives::broadcast(TensorView buf, int root, Stream stream) {
  broadcast_async(buf, root, stream)->wait();
}
void Collectives::barrier() { barrier_async()->wait(); }

void PointToPoint::send(TensorView in, int peer, int tag, Stream stream) {
  send_async(in, peer, tag, stream)->wait();
}
void PointToPoint::recv(TensorView out, int peer, int tag, Stream stream) {
  recv_async(out, peer, tag, stream)->wait();
}

namespace comm_check {

void reducible(const TensorView& t, std::string_view what) {
  check_not_empty(t, what);
  switch (t.dtype) {
    case DType::kFloat32:
    case DType::kFloat64:
    case DType::kBFloat16:
    case DType::kFloat16:
    case DType::kInt32:
      return;
    default:
      QMESH_THROW(what, " has dtype ", dtype_name(t.dtype),
                  "; reductions support fp32, fp64, bf16, fp16 and int32 (reduce FP8 data "
                  "after dequantizing it)");
  }
}

void all_gather_args(const TensorView& in, const TensorView& out, int size) {
  check_not_empty(in, "all_gather input");
  check_not_empty(out, "all_gather output");
  check_dtype(out, in.dtype, "all_gather output");
  check_device(out, in.device, "all_gather output");
  QMESH_CHECK(out.numel() == in.numel() * size, "all_gather output has ", out.numel(),
              " elements; expected size * input = ", size, " * ", in.numel(), " = ",
              in.numel() * size);
}

void reduce_scatter_args(const TensorView& in, const TensorView& out, int size) {
  reducible(in, "reduce_scatter input");
  check_not_empty(out, "reduce_scatter output");
  check_dtype(out, in.dtype, "reduce_scatter output");
  check_device(out, in.device, "reduce_scatter output");
  QMESH_CHECK(in.numel() == out.numel() * size, "reduce_scatter input has ", in.numel(),
              " elements; expected size * output = ", size, " * ", out.numel(), " = ",
              out.numel() * size);
}

void peer(int peer, int size, std::string_view what) {
  QMESH_CHECK(peer >= 0 && peer < size, what, " ", peer, " is out of range [0, ", size, ")");
}

void tag(int tag, int max_tag) {
  QMESH_CHECK(tag >= 0 && tag <= max_tag, "tag ", tag, " is out of range [0, ", max_tag, "]");
}

void message_args(const TensorView& t, int peer_rank, int size, int tag_value, int max_tag,
                  std::string_view side) {
  check_not_empty(t, detail::concat(side, " buffer"));
  peer(peer_rank, size, detail::concat(side, " peer"));
  tag(tag_value, max_tag);
}

}  // namespace comm_check

}  // namespace qmesh
