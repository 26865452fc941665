// XLA FFI handlers of the collective GEMMs (qmesh/overlap/collective_gemm.h) for JAX, and the
// registry of the communicators they run on.
//
// Communicators: qmesh_jax_make_local_comm(groups, size, timeout_ms) makes `groups` local
// worlds of `size` ranks each (the threads of one process: XLA runs every CPU device on a
// thread of its own) and returns their id. A mesh axis of size `size` whose other axes have
// `groups` index combinations gets one world per combination; Python makes it once per
// (mesh, axis) and passes the id as the attribute `comm`. Worlds live until the process ends.
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
// error of kind kDeadlineExceeded, whose message says that the axis must lie inside one
// process). Several processes (jax.distributed) work when each process holds whole groups:
// every process registers the same worlds and uses those of its own devices. Host tensors
// only: the CUDA symbols exist (one FFI macro) and refuse the call.
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "ffi/ffi_support.h"
#include "qmesh/comm/local.h"
#include "qmesh/overlap/collective_gemm.h"

namespace qmesh::ffi {
namespace {

// One rank's communicator and the lock that keeps its rings one at a time: a communicator is
// used by one thread at a time, and XLA may run two independent custom calls of one device
// side by side.
struct Rank {
  std::shared_ptr<Communicator> comm;
  std::unique_ptr<std::mutex> busy = std::make_unique<std::mutex>();
};

// The worlds of one registered (mesh, axis): groups[g][r] is rank r of group g.
using Worlds = std::vector<std::vector<Rank>>;

std::mutex registry_mutex;
std::deque<Worlds> registry;  // the id is the index; a deque keeps elements in place

Rank& rank_of(int64_t id, const AnyBuffer& coords) {
  require_dtype(coords, {DType::kInt32}, "coords (int32 [2]: group, rank on the axis)");
  require_count(coords, 2, "coords (int32 [2]: group, rank on the axis)");
  const auto* c = static_cast<const int32_t*>(coords.untyped_data());
  const std::lock_guard<std::mutex> lock(registry_mutex);
  QMESH_CHECK(id >= 0 && size_t(id) < registry.size(), "no communicator has the id ", id,
              ": make one with qmesh.jax.collective_gemm.communicator(mesh, axis)");
  Worlds& worlds = registry[size_t(id)];
  QMESH_CHECK(c[0] >= 0 && size_t(c[0]) < worlds.size() && c[1] >= 0 &&
                  size_t(c[1]) < worlds[size_t(c[0])].size(),
              "coords (group ", c[0], ", rank ", c[1], ") are outside communicator ", id, " (",
              worlds.size(), " groups of ", worlds.empty() ? 0 : worlds[0].size(), " ranks)");
  return worlds[size_t(c[0])][size_t(c[1])];
}

Overlap to_overlap(int32_t value) {
  QMESH_CHECK(value >= 0 && value <= 2, "overlap must be 0 (none), 1 (ring) or 2 (bidir), not ",
              value);
  return static_cast<Overlap>(value);
}

void require_host(const Where& w) {
  QMESH_CHECK_KIND(ErrorKind::kUnsupported, w.device.is_host(),
                   "the collective GEMMs of qmesh.jax run on the CPU devices of one process "
                   "(the local backend); on GPUs use collective_gemm=None");
}

// Runs ring(comm) on `rank`'s communicator, after the rank's earlier rings; a timeout gets
// the likely causes that JAX users can fix.
template <class Ring>
void run_ring(Rank& rank, Ring&& ring) {
  try {
    const std::lock_guard<std::mutex> lock(*rank.busy);
    ring(*rank.comm);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kTimeout) throw;
    QMESH_THROW_KIND(ErrorKind::kTimeout, e.message(),
                     "; the rings of qmesh.jax run on the local backend, so every device of the "
                     "mesh axis must belong to this process (with jax.distributed, keep the "
                     "sequence-parallel axis inside each process), and every device must run "
                     "the same collective GEMMs in the same order");
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
  require_host(w);
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
  run_ring(rank_of(comm, coords),
           [&](Communicator& c) { all_gather_gemm(c, args, out, to_overlap(overlap)); });
}

void gemm_reduce_scatter_impl(const Where& w, AnyBuffer a, AnyBuffer b, AnyBuffer a_scale_inv,
                              AnyBuffer b_scale_inv, AnyBuffer coords, Result<AnyBuffer> d,
                              int64_t comm, int32_t overlap, bool trans_b, bool split_accumulator,
                              int32_t a_block, int32_t b_block) {
  require_host(w);
  const GemmArgs args = gemm_args(w, a, b, a_scale_inv, b_scale_inv, Blocks{a_block, b_block},
                                  trans_b, split_accumulator, d);
  run_ring(rank_of(comm, coords),
           [&](Communicator& c) { gemm_reduce_scatter(c, args, to_overlap(overlap)); });
}

}  // namespace
}  // namespace qmesh::ffi

extern "C" {

// Makes `groups` local worlds of `size` ranks whose waits time out after timeout_ms (> 0;
// 0: comm_timeout()) and returns their id (>= 0), or -1 for groups < 1, size < 1 or
// timeout_ms < 0. Nothing is thrown across this boundary.
QMESH_API int64_t qmesh_jax_make_local_comm(int groups, int size, int64_t timeout_ms) {
  using namespace qmesh::ffi;
  if (groups < 1 || size < 1 || timeout_ms < 0) return -1;
  try {
    Worlds worlds;
    for (int g = 0; g < groups; ++g) {
      worlds.emplace_back();
      for (auto& comm : qmesh::make_local_world(size)) {
        if (timeout_ms > 0) comm->set_timeout(std::chrono::milliseconds(timeout_ms));
        worlds.back().push_back(Rank{std::move(comm)});
      }
    }
    const std::lock_guard<std::mutex> lock(registry_mutex);
    registry.push_back(std::move(worlds));
    return int64_t(registry.size()) - 1;
  } catch (...) {
    return -1;
  }
}

}  // extern "C"

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
