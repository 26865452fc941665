// Collective GEMMs for tensor parallelism with sequence parallelism: the all-gather before a
// GEMM and the reduce-scatter after one, pipelined with the GEMM in chunks of T/tp rows so
// that the transfers run while the GEMM computes. Written once against the Communicator
// interface (send_async / recv_async), so the rings work on every backend, across nodes too.
//
// Host or CUDA, chosen by the operands' device (one schedule for both):
// - Host tensors: the GEMM is qmesh::gemm on the host backend, transfers progress while it
//   runs; the call is blocking. The streams are ignored.
// - CUDA tensors (all on one device): the GEMMs (cuBLASLt) and the partial sums run on
//   streams.compute, the sends and receives on streams.comm, joined by CUDA events
//   (docs/design/overlap.md, "CUDA"). With a stream-native backend (NCCL) nothing in the ring
//   waits on the host: the call enqueues the schedule and returns. With a backend that moves
//   device buffers on the host's behalf (local: copies on the receivers' comm streams, so on
//   the copy engine beside the GEMMs) the host waits for each step's transfers while the
//   GEMMs run, and the call returns with the last GEMMs still enqueued. Not a host-blocking
//   call either way: the outputs are ready in streams.compute's order.
//   On return all of the call's work (GEMMs, transfers) is ordered before what is enqueued
//   next on streams.compute.
//   Buffer lifetime (CUDA): the inputs must be ready in streams.compute's order when the call
//   is made; A, B, D, gathered, bias, aux and the FP8 scalars must stay alive (inputs
//   unmodified) and the two streams must not be destroyed until streams.compute has passed
//   the call's work. Scratch memory is stream-ordered (cudaMallocAsync on streams.compute)
//   and released the same way.
//   With NCCL a failed or stuck transfer surfaces at the communicator's next wait (as for
//   every stream-ordered NCCL operation), not inside the call.
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

// The streams of a collective GEMM on CUDA tensors: two distinct, non-null streams of the
// tensors' device (Error otherwise; both required, no hidden default); ignored for host
// tensors. One transfer stream suffices: NCCL runs one communicator's operations one after
// another whatever their streams, so the ring orders each step's send and receive to pair
// them (even ranks send first, odd ranks receive first).
struct CollectiveGemmStreams {
  Stream compute;  // the GEMMs, copies and sums; inputs ready and outputs used in its order
  Stream comm;     // the sends and receives (and, for FP8, the scale_inv all-gather)
};

// "none", "ring", "bidir" (the training example's --overlap values).
QMESH_API std::string_view overlap_name(Overlap overlap);
// Inverse of overlap_name; Error listing the accepted names.
QMESH_API Overlap parse_overlap(std::string_view name);

// All-gather + GEMM:  D [T, N] = epilogue(gather(A) · op(B)), T = comm.size() · T_local.
//   args.a:    this rank's sequence chunk [T_local, K] (trans_a must be kNo); fp32, bf16 or
//              FP8 (then B is FP8 too). FP8 chunks travel as FP8 codes; every rank's
//              scale_inv must be the same (the global amax reduction makes it so), which is
//              checked. Host tensors: Error otherwise (ring schedules compare the
//              neighbours' in the first step, kNone all-gathers the tp values). CUDA: the
//              values are all-gathered on streams.comm and compared by a kernel after the
//              GEMMs, which fills D (and d_amax) with NaN when they differ; the host never
//              waits for the device.
//   args.b, trans_b, alpha, epilogue, bias: as for gemm(); the epilogue must be row-wise
//              (not kBiasGrad); aux, when used, is [T, N] like D.
//   args.d:    [T, N]. Rows of chunk c (rank c's tokens) are computed by one GEMM call. An
//              FP8 D's d_amax is the max over all chunks (the amax of the whole D).
//              Or block-scaled FP8 with 1x128 blocks (GemmOperand::fp8_block; B block-scaled
//              too): every rank's chunk was quantized on its own, which is exact, because a
//              1x128 block lies in one row: the chunks' codes and scales are those of the block
//              cast of the gathered input. Each chunk's scales ([ceil(K/128),
//              round_up(T_local, 4)], its own layout) travel with its codes.
//   gathered:  storage [T, K] of A's dtype on A's device (plain, FP8 or 1x128 block-scaled,
//              without a columnwise copy); after the call (CUDA: in streams.compute's order)
//              it holds gather(A) in rank order (for the backward GEMMs), and for FP8 its
//              scale, scale_inv and amax are set to A's; block-scaled: its scale_inv
//              [ceil(K/128), round_up(T, 4)] receives the chunks' scales in the layout of
//              [T, K] (chunk c's at columns [c·T_local, (c+1)·T_local) of every scale row;
//              the padding is not written), so that it is bitwise the rowwise block cast of
//              the gathered input. Must not overlap A or D. On CUDA, FP8 operands are read in the
//              TN form: A's rowwise chunks as they are, B by gemm()'s rule (trans_b kNo needs
//              B's columnwise copy); a backward GEMM that reads `gathered` transposed needs its
//              own columnwise copy (cast_transpose), which this call does not make.
// Collective over `comm` (every rank calls it with the same shapes, overlap and tensor
// device). Host tensors: blocking; CUDA tensors: stream-ordered, as described above. Every host
// wait is bounded by comm.timeout() from the start (a peer that stops answering gives qmesh::Error,
// not a hang). Error for shapes that do not match, with a message naming them, before any transfer.
QMESH_API void all_gather_gemm(Communicator& comm, const GemmArgs& args,
                               const GemmOperand& gathered, Overlap overlap,
                               const CollectiveGemmStreams& streams = {});

// GEMM + reduce-scatter:  D [T_local, N] = chunk rank() of sum over ranks of (A · op(B)).
//   args.a:    [T, K] (trans_a kNo; T divisible by comm.size(), Error otherwise); plain,
//              FP8 with B, or block-scaled with 1x128 blocks with a block-scaled B (each
//              chunk's GEMM reads a copy of the chunk's scales in its own layout).
//   args.b, trans_b, alpha: as for gemm(); epilogue must be kNone and output kWrite (add a
//              bias after the reduction).
//   args.d:    fp32 [T / comm.size(), N].
// A block-scaled A with 128x128 blocks is refused by both collective GEMMs (a chunk of rows
// cuts the tiles).
// Collective, bounded waits, host or CUDA, as all_gather_gemm. Partial sums travel as fp32 and
// are added by the host (host tensors) or by a kernel on streams.compute (CUDA), in the ring
// order above on both (the GEMM writes each partial; it never accumulates into one).
QMESH_API void gemm_reduce_scatter(Communicator& comm, const GemmArgs& args, Overlap overlap,
                                   const CollectiveGemmStreams& streams = {});

}  // namespace qmesh
