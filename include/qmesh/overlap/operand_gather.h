// Bulk overlap: the all-gather of a cast GEMM operand, started before independent work and
// finished after it, so that the transfer runs beside that work. The column-parallel layers
// use it in backward: with GatheredInput::kRegather the input that wgrad needs is gathered
// again while the dgrad GEMM (itself a collective GEMM) runs.
#pragma once

#include <memory>

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/overlap/collective_gemm.h"

namespace qmesh {

// One all-gather of `chunk` (this rank's rows [T_local, K], the 2-D view of its shape: fp32,
// bf16, or FP8 rowwise codes; block-scaled operands are refused) into `gathered` ([T, K] of the
// same kind, T = comm.size() · T_local, on the same device; an FP8 columnwise copy is not filled).
// For FP8, `gathered` also receives chunk's scale, scale_inv and amax: every rank's must be the
// same (the global amax reduction makes them so; all_gather_gemm checked it when the operand was
// first gathered).
// - Host tensors: the backend moves the data while the caller computes (the local backend's
//   worker thread, MPI's progress thread, UCX's worker); finish() waits for it.
// - CUDA tensors: the transfer runs on streams.comm after the work streams.compute holds at
//   construction (the chunk's producer, and earlier readers of `gathered`); finish() orders
//   streams.compute after it, waiting on the host only for backends that move device
//   buffers on the host's behalf (local), not for NCCL.
// Both tensors must stay alive, and `chunk` unmodified, until finish() has returned (CUDA:
// until streams.compute has passed it). Issued collectively, like every collective.
class QMESH_API OperandGather {
 public:
  // Checks the arguments (Error naming what differs) and starts the transfer.
  OperandGather(Communicator& comm, const GemmOperand& chunk, const GemmOperand& gathered,
                const CollectiveGemmStreams& streams);
  // Finishes an unfinished gather; an error is logged, not thrown (call finish() to see it).
  ~OperandGather();
  OperandGather(const OperandGather&) = delete;
  OperandGather& operator=(const OperandGather&) = delete;

  // Waits as described above, bounded by comm.timeout() from construction (Error naming this rank
  // and the cause on a timeout or a failed transfer). Later calls return at once.
  void finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qmesh
