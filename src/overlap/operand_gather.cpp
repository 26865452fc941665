#include "qmesh/overlap/operand_gather.h"

#include <chrono>
#include <exception>
#include <optional>
#include <string>

#include "qmesh/device.h"
#include "qmesh/error.h"
#include "qmesh/logging.h"
#include "ring_device.h"

namespace qmesh {

namespace {

const TensorView& data_of(const GemmOperand& op) {
  return op.is_quantized() ? op.quantized.data : op.tensor;
}

// The FP8 scale factors travel with the codes: `gathered` takes the chunk's (on CUDA in
// streams.compute's order, where the GEMMs that read them run).
void copy_scalars(const QuantizedTensorView& from, const QuantizedTensorView& to, bool cuda,
                  Stream compute) {
  auto copy = [&](float* dst, const float* src) {
    if (!dst || !src) return;
    if (cuda)
      overlap_detail::copy_async(dst, src, sizeof(float), compute);
    else
      *dst = *src;
  };
  copy(to.scale, from.scale);
  copy(to.scale_inv, from.scale_inv);
  copy(to.amax, from.amax);
}

}  // namespace

struct OperandGather::Impl {
  Communicator& comm;
  bool cuda;
  int device = -1;
  CollectiveGemmStreams streams;
  std::string what;
  WorkHandle work;

  // Waits for the transfer (bounded by `budget` unless it completes in stream order), then
  // orders the compute stream after it.
  void finish(std::chrono::milliseconds budget) {
    if (!work) return;
    std::optional<DeviceGuard> current;
    if (cuda) current.emplace(device);
    // NCCL completes in stream order: dropping the handle does not block.
    if (!(cuda && comm.stream_ordered())) {
      try {
        work->wait(budget);
      } catch (const Error& e) {
        work.reset();
        QMESH_THROW(what, " failed: ", e.what());
      }
    }
    work.reset();
    if (cuda) overlap_detail::join_streams(streams.compute, streams.comm);
  }
};

OperandGather::OperandGather(Communicator& comm, const GemmOperand& chunk,
                             const GemmOperand& gathered, const CollectiveGemmStreams& streams) {
  const char* op = "OperandGather";
  const TensorView& c = data_of(chunk);
  const TensorView& g = data_of(gathered);
  const int n = comm.size();
  QMESH_CHECK(chunk.is_quantized() == gathered.is_quantized() && c.dtype == g.dtype, op,
              ": gathered must be of the chunk's kind and dtype ", dtype_name(c.dtype), ", got ",
              dtype_name(g.dtype));
  QMESH_CHECK(c.device == g.device, op, ": the chunk is on ", c.device.str(), " and gathered on ",
              g.device.str(), "; both must be on one device");
  QMESH_CHECK(g.shape.rows() == n * c.shape.rows() && g.shape.cols() == c.shape.cols(), op,
              ": gathered must be [", n * c.shape.rows(), ", ", c.shape.cols(), "] (tp=", n,
              " chunks of ", c.shape.str(), "), got ", g.shape.str());
  const char* c_begin = static_cast<const char*>(c.data);
  const char* g_begin = static_cast<const char*>(g.data);
  QMESH_CHECK(c_begin + c.nbytes() <= g_begin || g_begin + g.nbytes() <= c_begin, op,
              ": the chunk must not overlap the gathered storage");
  const bool cuda = c.device.is_cuda();
  if (cuda) {
    require_device(c.device);
    overlap_detail::require_two_streams(streams.compute, streams.comm, op);
  }
  impl_ = std::make_unique<Impl>(Impl{
      comm, cuda, cuda ? c.device.index : -1, streams,
      std::string(op) + " (rank " + std::to_string(comm.rank()) + " of " + std::to_string(n) + ")",
      nullptr});
  std::optional<DeviceGuard> current;
  if (cuda) {
    current.emplace(c.device.index);
    void* ready = overlap_detail::record_event(streams.compute);
    try {
      overlap_detail::wait_event(streams.comm, ready);
    } catch (...) {
      overlap_detail::destroy_event(ready);
      throw;
    }
    overlap_detail::destroy_event(ready);
  }
  if (chunk.is_quantized())
    copy_scalars(chunk.quantized, gathered.quantized, cuda, streams.compute);
  impl_->work = comm.all_gather_async(c, g, streams.comm);
}

OperandGather::~OperandGather() {
  if (!impl_ || !impl_->work) return;
  // Unwinding from a failure (a dead peer failed the GEMM beside it): no further wait.
  const auto budget =
      std::uncaught_exceptions() > 0 ? std::chrono::milliseconds(0) : comm_timeout();
  try {
    impl_->finish(budget);
  } catch (const Error& e) {
    QMESH_LOG_ERROR("unfinished ", impl_->what, " dropped: ", e.what());
  }
}

void OperandGather::finish() { impl_->finish(comm_timeout()); }

}  // namespace qmesh
