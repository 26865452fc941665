// Collective GEMMs for tensor parallelism with sequence parallelism: the all-gather before a
// GEMM and the reduce-scatter after one, pipelined with the GEMM in chunks of T/tp rows so
// that the transfers run while the GEMM computes. Written once against the Communicator
// interface (send_async / recv_async), so the rings work on every backend, across nodes too.
//
// Host only: operands, outputs and the communicator's buffers are host tensors; the GEMM is
// qmesh::gemm on the host backend, and transfers progress while it runs.
//
// Bitwise contract (docs/design/overlap.md): on every backend, every Overlap value gives the
// same bits. All modes compute the GEMM in the same per-chunk pieces (chunk c = rows
// [c·T/tp, (c+1)·T/tp) of the token dimension), and every mode reduces the partial sums
// with the same ring over send/recv, in one fixed order: chunk c = ((P[c+1] + P[c+2]) + ...)
// + P[c], ranks mod tp (the order of the local backend's ring reduce-scatter too).
#pragma once

#include <cstdint>
#include <string_view>

#include "qmesh/comm/communicator.h"
#include "qmesh/export.h"
#include "qmesh/ops/gemm.h"

namespace qmesh {

// How a collective GEMM is scheduled.
enum class Overlap : uint8_t {
  kNone,           // all-gather then the chunked GEMMs; the chunked GEMMs then the ring
                   // reduce-scatter (no transfer runs during a GEMM)
  kRing,           // tp steps; each step's transfer runs alongside that step's GEMM
  kBidirectional,  // all-gather: chunks travel both ways round the ring, ceil(tp/2)
                   // transfer steps; reduce-scatter: the same as kRing (its summation order
                   // must stay the ring's)
};

// "none", "ring", "bidir" (the training example's --overlap values).
QMESH_API std::string_view overlap_name(Overlap overlap);
// Inverse of overlap_name; Error listing the accepted names.
QMESH_API Overlap parse_overlap(std::string_view name);

// All-gather + GEMM:  D [T, N] = epilogue(gather(A) · op(B)), T = comm.size() · T_local.
//   args.a:    this rank's sequence chunk [T_local, K] (trans_a must be kNo); fp32, bf16 or
//              FP8 (then B is FP8 too). FP8 chunks travel as FP8 codes; every rank's
//              scale_inv must be the same (the global amax reduction makes it so), which is
//              checked against the neighbours' (Error otherwise).
//   args.b, trans_b, alpha, epilogue, bias: as for gemm(); the epilogue must be row-wise
//              (not kBiasGrad); aux, when used, is [T, N] like D.
//   args.d:    [T, N]. Rows of chunk c (rank c's tokens) are computed by one GEMM call.
//   gathered:  storage [T, K] of A's dtype (plain, or FP8 without a columnwise copy); on
//              return it holds gather(A) in rank order (for the backward GEMMs), and for FP8
//              its scale, scale_inv and amax are set to A's. Must not overlap A or D.
// Collective over `comm` (every rank calls it with the same shapes and overlap). Blocking;
// every wait is bounded by comm_timeout() from the start (a peer that stops answering gives
// qmesh::Error, not a hang). Error for shapes that do not match, with a message naming them.
QMESH_API void all_gather_gemm(Communicator& comm, const GemmArgs& args,
                               const GemmOperand& gathered, Overlap overlap);

// GEMM + reduce-scatter:  D [T_local, N] = chunk rank() of sum over ranks of (A · op(B)).
//   args.a:    [T, K] (trans_a kNo; T divisible by comm.size(), Error otherwise); plain or
//              FP8 with B.
//   args.b, trans_b, alpha: as for gemm(); epilogue must be kNone and output kWrite (add a
//              bias after the reduction).
//   args.d:    fp32 [T / comm.size(), N].
// Collective, blocking, bounded waits, as all_gather_gemm. Partial sums travel as fp32.
QMESH_API void gemm_reduce_scatter(Communicator& comm, const GemmArgs& args, Overlap overlap);

}  // namespace qmesh
