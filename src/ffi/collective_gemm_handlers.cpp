// XLA FFI handlers of the collective GEMMs (qmesh/overlap/collective_gemm.h) for JAX.
//
// Communicators: registered once per (mesh, axis) (jax_comm_registry.h: one world per index
// combination of the other axes; local worlds when the axis lies inside the process, UCX
// worlds across processes, NCCL worlds on GPUs); Python passes the id as the attribute `comm`.
//
// Operands of both handlers: a, b (2-D; b stored as trans_b says), a_scale_inv, b_scale_inv
// (fp32 [1], read for FP8 operands only), coords (int32 [2]: the group of the device, its rank
// on the axis; e.g. from jax.lax.axis_index inside shard_map). Attributes: comm (int64),
// overlap (0 none, 1 ring, 2 bidir: qmesh::Overlap), trans_b, split_accumulator, a_block and
// b_block (0 per tensor or plain, 1: 1x128 blocks, 2: 128x128 tiles; a block-scaled operand's
// scale_inv is its scale tensor in the C++ layout, block_quantized_tensor.h; the rings take a
// with 1x128 blocks only).
//   QmeshAllGatherGemm:    a [T/tp, K] -> d f32 [T, N], gathered [T, K] (a's dtype, rank
//                          order), gathered_scales: per-tensor FP8 a: f32 [3] (scratch for
//                          gathered's scale, scale_inv, amax); block-scaled a: gathered's
//                          scale tensor f32 [ceil(K/128), round_up(T, 4)] (padding not
//                          written); otherwise unused.
//   QmeshGemmReduceScatter: a [T, K] -> d f32 [T/tp, N] (rank `rank`'s chunk of the sum).
// The calls have no side effect for XLA (jax.checkpoint may recompute them). Two rings of one
// device run one after the other (a lock per rank); every device must run them in the same
// order, as one XLA schedule of the program does (otherwise they time out).
// Every wait is bounded by the communicator's timeout (a peer that never calls is an FFI
// error of kind kDeadlineExceeded that names the likely causes).
// CUDA: device buffers on an NCCL communicator (ring_place.h: XLA's stream and the rank's
// transfer stream; no host wait; coords are not read); a CUDA call on another communicator is
// refused. Not command-buffer compatible (no traits): the ring allocates stream-ordered scratch
// and issues NCCL transfers on a stream of its own, which XLA must not capture in a CUDA graph.
#include <cstdint>
#include <mutex>

#include "ffi/ffi_support.h"
#include "ffi/jax_comm_registry.h"
#include "ffi/ring_place.h"
#include "qmesh/overlap/collective_gemm.h"

namespace qmesh::ffi {
namespace {

Overlap to_overlap(int32_t value) {
  QMESH_CHECK(value >= 0 && value <= 2, "overlap must be 0 (none), 1 (ring) or 2 (bidir), not ",
              value);
  return static_cast<Overlap>(value);
}

// Runs ring(comm, streams) at `place`, after the rank's earlier rings (CUDA: after they were
// enqueued); a timeout gets the likely causes that JAX users can fix.
template <class Ring>
void run_ring(const RingPlace& place, Ring&& ring) {
  try {
    const std::lock_guard<std::mutex> lock(*place.rank.busy);
    ring(*place.rank.comm, place.streams);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTimeout) throw;
    QMESH_THROW_KIND(ErrorKind::kTimeout, e.message(),
                     "; every device of the mesh axis (in every process) must run the same "
                     "collective GEMMs in the same order, on the mesh the communicator was made "
                     "for (jax.set_mesh(mesh) around the step when the axis spans processes)");
  }
}

// The blocks of the operands (a_block, b_block attributes).
struct Blocks {
  int32_t a = 0;
  int32_t b = 0;
};

GemmArgs gemm_args(const Where& w, const AnyBuffer& a, const AnyBuffer& b,
                   const AnyBuffer& a_scale_inv, const AnyBuffer& b_scale_inv, Blocks blocks,
                   bool trans_b, bool split_accumulator, Result<AnyBuffer>& d) {
  GemmArgs args;
  args.a = gemm_operand(w, a, a_scale_inv, blocks.a, "a",
                        "a_scale_inv (the FP8 operand a's scale_inv or scale tensor)");
  args.b = gemm_operand(w, b, b_scale_inv, blocks.b, "b",
                        "b_scale_inv (the FP8 operand b's scale_inv or scale tensor)");
  args.trans_b = trans_b ? GemmTranspose::kYes : GemmTranspose::kNo;
  args.accumulation = split_accumulator ? GemmAccumulation::kSplit : GemmAccumulation::kFast;
  require_dtype(*d, {DType::kFloat32}, "d (the collective GEMM's output)");
  require_rank(*d, 2, "d (the collective GEMM's output)");
  args.d = view(d, w, "d (the collective GEMM's output)");
  return args;
}

void all_gather_gemm_impl(const Where& w, AnyBuffer a, AnyBuffer b, AnyBuffer a_scale_inv,
                          AnyBuffer b_scale_inv, AnyBuffer coords, Result<AnyBuffer> d,
                          Result<AnyBuffer> gathered, Result<AnyBuffer> gathered_scales,
                          int64_t comm, int32_t overlap, bool trans_b, bool split_accumulator,
                          int32_t a_block, int32_t b_block) {
  GemmArgs args = gemm_args(w, a, b, a_scale_inv, b_scale_inv, Blocks{a_block, b_block}, trans_b,
                            split_accumulator, d);
  require_rank(*gathered, 2, "gathered");
  const TensorView g = view(gathered, w, "gathered");
  GemmOperand out = GemmOperand::plain(g);
  if (args.a.is_block_scaled()) {
    require_dtype(*gathered_scales, {DType::kFloat32}, "gathered_scales");
    BlockQuantizedTensorView q;
    q.block = args.a.block.block;
    q.data = g;
    q.scale_inv = view(gathered_scales, w, "gathered_scales (gathered's scale tensor)");
    out = GemmOperand::fp8_block(q);
  } else if (args.a.is_quantized()) {
    require_dtype(*gathered_scales, {DType::kFloat32}, "gathered_scales");
    require_count(*gathered_scales, 3, "gathered_scales");
    auto* s = static_cast<float*>(gathered_scales->untyped_data());
    QuantizedTensorView q;
    q.data = g;
    q.scale = s;
    q.scale_inv = s + 1;
    q.amax = s + 2;
    out = GemmOperand::fp8(q);
  }
  run_ring(ring_place(w, comm, coords), [&](Communicator& c, const CollectiveGemmStreams& s) {
    all_gather_gemm(c, args, out, to_overlap(overlap), s);
  });
}

void gemm_reduce_scatter_impl(const Where& w, AnyBuffer a, AnyBuffer b, AnyBuffer a_scale_inv,
                              AnyBuffer b_scale_inv, AnyBuffer coords, Result<AnyBuffer> d,
                              int64_t comm, int32_t overlap, bool trans_b, bool split_accumulator,
                              int32_t a_block, int32_t b_block) {
  const GemmArgs args = gemm_args(w, a, b, a_scale_inv, b_scale_inv, Blocks{a_block, b_block},
                                  trans_b, split_accumulator, d);
  run_ring(ring_place(w, comm, coords), [&](Communicator& c, const CollectiveGemmStreams& s) {
    gemm_reduce_scatter(c, args, to_overlap(overlap), s);
  });
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshAllGatherGemm, qmesh::ffi::all_gather_gemm_impl,
                  .Arg<AnyBuffer>()      // a [T/tp, K]
                      .Arg<AnyBuffer>()  // b
                      .Arg<AnyBuffer>()  // a_scale_inv
                      .Arg<AnyBuffer>()  // b_scale_inv
                      .Arg<AnyBuffer>()  // coords
                      .Ret<AnyBuffer>()  // d [T, N]
                      .Ret<AnyBuffer>()  // gathered [T, K]
                      .Ret<AnyBuffer>()  // gathered_scales
                      .Attr<int64_t>("comm")
                      .Attr<int32_t>("overlap")
                      .Attr<bool>("trans_b")
                      .Attr<bool>("split_accumulator")
                      .Attr<int32_t>("a_block")
                      .Attr<int32_t>("b_block"));

QMESH_FFI_HANDLER(QmeshGemmReduceScatter, qmesh::ffi::gemm_reduce_scatter_impl,
                  .Arg<AnyBuffer>()      // a [T, K]
                      .Arg<AnyBuffer>()  // b
                      .Arg<AnyBuffer>()  // a_scale_inv
                      .Arg<AnyBuffer>()  // b_scale_inv
                      .Arg<AnyBuffer>()  // coords
                      .Ret<AnyBuffer>()  // d [T/tp, N]
                      .Attr<int64_t>("comm")
                      .Attr<int32_t>("overlap")
                      .Attr<bool>("trans_b")
                      .Attr<bool>("split_accumulator")
                      .Attr<int32_t>("a_block")
                      .Attr<int32_t>("b_block"));
