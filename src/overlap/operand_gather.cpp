#include "qmesh/overlap/operand_gather.h"

#include <exception>
#include <optional>

#include "qmesh/error.h"
#include "qmesh/logging.h"
#include "ring_exec.h"

namespace qmesh {

struct OperandGather::Impl {
  overlap_detail::RingExec exec;
  WorkHandle work;
};

OperandGather::OperandGather(Communicator& comm, const GemmOperand& chunk,
                             const GemmOperand& gathered, const CollectiveGemmStreams& streams) {
  const char* op = "OperandGather";
  QMESH_CHECK_KIND(ErrorKind::kUnsupported, !chunk.is_block_scaled(), op,
                   ": block-scaled operands are gathered by all_gather_gemm (their scales are "
                   "laid out per chunk); gather the high-precision input instead");
  overlap_detail::check_gathered(chunk, gathered, comm.size(), op, "the chunk");
  const TensorView& c = overlap_detail::operand_data(chunk);
  overlap_detail::check_device(c.device, streams, op);
  const auto current = overlap_detail::make_current(c.device);
  impl_.reset(new Impl{{comm, c.device, streams, op}, nullptr});
  overlap_detail::RingExec& exec = impl_->exec;
  exec.start();
  // The FP8 scale factors travel with the codes: `gathered` takes the chunk's (on CUDA in
  // streams.compute's order, where the GEMMs that read them run).
  if (chunk.is_quantized()) exec.copy_scalars(chunk.quantized, gathered.quantized);
  impl_->work = exec.all_gather_async(c, overlap_detail::operand_data(gathered));
}

OperandGather::~OperandGather() {
  if (!impl_) return;
  try {
    if (std::uncaught_exceptions() > 0) {
      // Unwinding from a failure (a dead peer failed the GEMM beside it): no further wait.
      const auto current = overlap_detail::make_current(impl_->exec.device());
      impl_->exec.abandon();
      impl_.reset();
    } else {
      finish();
    }
  } catch (const Error& e) {
    QMESH_LOG_ERROR("OperandGather dropped unfinished: ", e.what());
  }
}

// Waits for the transfer (unless it completes in stream order); ending the RingExec then
// orders the compute stream after it.
void OperandGather::finish() {
  if (!impl_) return;
  const auto current = overlap_detail::make_current(impl_->exec.device());
  std::unique_ptr<Impl> impl = std::move(impl_);
  impl->exec.finish(impl->work, 0, "all-gather");
}

}  // namespace qmesh
