#include "qmesh/overlap/collective_gemm.h"

#include <string>
#include <vector>

#include "qmesh/error.h"
#include "ring_exec.h"

namespace qmesh {

namespace {

using overlap_detail::operand_data;
using overlap_detail::operand_rows;
using overlap_detail::RingExec;

// Tags of the rings' point-to-point messages (a communicator must not carry other traffic
// with these tags while a collective GEMM runs).
constexpr int kTagRight = 0x5100;  // chunks moving to rank + 1
constexpr int kTagLeft = 0x5101;   // chunks moving to rank - 1
constexpr int kTagScaleRight = 0x5102;
constexpr int kTagScaleLeft = 0x5103;
constexpr int kTagPartial = 0x5104;          // partial sums of the reduce-scatter ring
constexpr int kTagBlockScaleRight = 0x5105;  // block scales of the chunks moving right
constexpr int kTagBlockScaleLeft = 0x5106;   // and left

// Block-scaled A (docs/design/overlap.md "Block-scaled operands"). 1x128 blocks lie along a
// row, so a chunk of rows is whole blocks with scales of its own; but in the scale layout of
// [rows, K], [ceil(K/128), round_up(rows, 4)], a chunk's scales are a range of columns of
// every scale row. So each chunk's GEMM reads its scales from a contiguous copy in the layout
// of the chunk alone, [ceil(K/128), round_up(chunk, 4)] (padding zero), and such copies are
// what travels round the rings.
Shape chunk_scale_shape(int64_t chunk, int64_t k) {
  return block_scale_shape(chunk, k, BlockShape::k1x128);
}

// The 1x128-block-scaled operand of `codes` with `scales` (rowwise only).
GemmOperand block_operand(const TensorView& codes, const TensorView& scales) {
  BlockQuantizedTensorView q;
  q.block = BlockShape::k1x128;
  q.data = codes;
  q.scale_inv = scales;
  return GemmOperand::fp8_block(q);
}

// A block-scaled A: 1x128 blocks (a chunk of rows would cut 128x128 tiles), a valid view.
void check_block_a(const GemmOperand& a, const char* op) {
  QMESH_CHECK(a.block.block == BlockShape::k1x128, op,
              ": a block-scaled A must have 1x128 blocks (a chunk of token rows cuts 128x128 "
              "tiles); quantize activations and gradients with BlockShape::k1x128");
  a.block.validate(op);
}

// Copies chunk c's scales between `whole` (the layout of [tokens, K]) and `own` (the
// chunk's, chunk_scale_shape): KB rows of `chunk` floats, `whole` from column c * chunk.
void copy_chunk_scales(RingExec& exec, const TensorView& whole, const TensorView& own, int c,
                       int64_t chunk, bool into_whole) {
  constexpr size_t f = sizeof(float);
  float* w = whole.data_as<float>() + c * chunk;
  float* o = own.data_as<float>();
  const size_t whole_pitch = static_cast<size_t>(whole.shape.cols()) * f;
  const size_t own_pitch = static_cast<size_t>(own.shape.cols()) * f;
  const size_t width = static_cast<size_t>(chunk) * f;
  const size_t height = static_cast<size_t>(whole.shape.rows());
  if (into_whole)
    exec.copy_2d(w, whole_pitch, o, own_pitch, width, height);
  else
    exec.copy_2d(o, own_pitch, w, whole_pitch, width, height);
}

// All tensors on A's device (returned); CUDA tensors need the two streams.
Device check_common(const GemmArgs& args, const CollectiveGemmStreams& streams, const char* op) {
  if (args.a.is_block_scaled()) check_block_a(args.a, op);
  QMESH_CHECK(args.trans_a == GemmTranspose::kNo, op,
              ": A must be stored [tokens, K] (trans_a kNo), got trans_a kYes");
  const Device device = args.a.device();
  QMESH_CHECK(args.d.device == device, op, ": A is on ", device.str(), " and D on ",
              args.d.device.str(), "; a collective GEMM's tensors live on one device");
  QMESH_CHECK(args.epilogue != GemmEpilogue::kBiasGrad, op,
              ": the kBiasGrad epilogue sums over the token chunks and cannot be split");
  overlap_detail::check_device(device, streams, op);
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
  if (!args.aux.empty()) step.aux = args.aux.rows(begin, begin + count);
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
  const auto current = overlap_detail::make_current(device);
  const int n = comm.size(), r = comm.rank();
  const TensorView& a = operand_data(args.a);
  const TensorView& g = operand_data(gathered);
  const int64_t chunk = a.shape.rows(), tokens = chunk * n;
  overlap_detail::check_gathered(args.a, gathered, n, op, "A");
  QMESH_CHECK(!gathered.is_quantized() || !gathered.quantized.has_columnwise(), op,
              ": gathered FP8 storage must not have a columnwise copy (it receives rowwise "
              "chunks only)");
  const bool block = args.a.is_block_scaled();
  if (block) {
    QMESH_CHECK(!gathered.block.has_columnwise(), op,
                ": gathered block-scaled storage must not have a columnwise copy (its 1x128 "
                "blocks span the ranks' chunks; cast it from the gathered input)");
    gathered.block.validate("all_gather_gemm gathered");
  }
  QMESH_CHECK(args.d.shape.rows() == tokens, op, ": D must have ", tokens, " rows (tp=", n, " x ",
              chunk, " tokens), got shape ", args.d.shape.str());
  QMESH_CHECK(!args.aux.empty() || (args.epilogue != GemmEpilogue::kBiasGeluAux &&
                                    args.epilogue != GemmEpilogue::kDGelu),
              op, ": the epilogue needs aux");
  QMESH_CHECK(args.aux.empty() || args.aux.shape.rows() == tokens, op, ": aux must have ", tokens,
              " rows, got shape ", args.aux.shape.str());
  {  // B, the epilogue and D's columns are checked on the first chunk, before any transfer.
    GemmArgs probe = args;
    probe.d = args.d.rows(0, chunk);
    if (!args.aux.empty()) probe.aux = args.aux.rows(0, chunk);
    check_gemm(probe, op);
  }
  RingExec exec(comm, device, streams, op);
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
  if (fp8) exec.copy_scalars(args.a.quantized, gathered.quantized);
  // Block scales: chunk c's at rows [c·KB, (c+1)·KB) of `chunk_scales`, each chunk's own
  // layout (chunk_scale_shape) one after another; copied into gathered's layout at the end.
  const Shape own_scales = chunk_scale_shape(chunk, a.shape.cols());  // used when block
  const int64_t kb = own_scales.rows();
  const TensorView chunk_scales =
      block ? exec.scratch(DType::kFloat32, Shape{n * kb, own_scales.cols()}) : TensorView();
  auto scale_slot = [&](int c) { return chunk_scales.rows(c * kb, (c + 1) * kb); };
  // An FP8 D's amax is the max over the chunks' (docs/numerics.md "FP8 GEMM output amax"):
  // each chunk's GEMM writes its own, combined after the last one. One 16-byte slot per chunk:
  // cuBLASLt runs an FP8 GEMM on its amax pointer only when it is 16-byte aligned (else the
  // GEMM stages it, docs/design/gemm.md).
  constexpr int kAmaxSlot = int(QuantizedTensor::kScalarSlot);
  float* chunk_amax =
      args.d_amax && n > 1
          ? exec.scratch(DType::kFloat32, Shape{int64_t(n) * kAmaxSlot}).data_as<float>()
          : nullptr;
  // arrived[c]: the mark after which chunk c (codes and block scales) is in place.
  std::vector<RingExec::Mark> arrived(static_cast<size_t>(n), nullptr);
  auto slot = [&](int c) { return g.rows(c * chunk, (c + 1) * chunk); };
  auto chunk_gemm = [&](int c) {
    exec.compute_after(arrived[static_cast<size_t>(c)]);
    GemmArgs step = args;
    if (chunk_amax) step.d_amax = chunk_amax + c * kAmaxSlot;
    const GemmOperand rows =
        block ? block_operand(slot(c), scale_slot(c)) : operand_rows(gathered, c * chunk, chunk);
    gemm_rows(exec, step, rows, args.d.rows(c * chunk, (c + 1) * chunk), c * chunk, chunk);
  };
  // One step's transfers of a chunk: the codes and, for block scaling, its scales.
  struct ChunkExchange {
    RingExec::Exchange codes, scales;
  };
  auto exchange_chunk = [&](int out, int to, int in, int from, int tag, int scale_tag) {
    ChunkExchange x;
    const RingExec::Mark ready = arrived[static_cast<size_t>(out)];
    x.codes = exec.exchange(slot(out), to, ready, slot(in), from, nullptr, tag);
    if (block)
      x.scales =
          exec.exchange(scale_slot(out), to, ready, scale_slot(in), from, nullptr, scale_tag);
    return x;
  };
  auto finish_chunk = [&](ChunkExchange& x, int in, int s, const char* send_what,
                          const char* recv_what) {
    exec.finish(x.codes.send, s, send_what);
    RingExec::Mark m = exec.finish(x.codes.recv, s, recv_what);
    if (block) {
      exec.finish(x.scales.send, s, send_what);
      m = exec.finish(x.scales.recv, s, recv_what);
    }
    arrived[static_cast<size_t>(in)] = m;
  };
  if (overlap == Overlap::kNone || n == 1) {
    RingExec::Mark all = exec.all_gather(a, g, 0, "all-gather");
    if (block) all = exec.all_gather(args.a.block.scale_inv, chunk_scales, 0, "scale all-gather");
    for (int c = 0; c < n; ++c) {
      arrived[static_cast<size_t>(c)] = all;
      chunk_gemm(c);
    }
  } else {
    exec.copy(slot(r).data, a.data, a.nbytes());
    if (block) exec.copy(scale_slot(r).data, args.a.block.scale_inv.data, scale_slot(r).nbytes());
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
      ChunkExchange right, left;
      WorkHandle scale_works[4];
      const int right_in = mod(r - s - 1, n), right_out = mod(r - s, n);
      const int left_in = mod(r + s + 1, n), left_out = mod(r + s, n);
      auto post = [&] {
        if (s < h_right)
          right = exchange_chunk(right_out, next, right_in, prev, kTagRight, kTagBlockScaleRight);
        if (s < h_left)
          left = exchange_chunk(left_out, prev, left_in, next, kTagLeft, kTagBlockScaleLeft);
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
      if (s < h_right)
        finish_chunk(right, right_in, s, "send to the next rank", "receive from the previous rank");
      if (s < h_left)
        finish_chunk(left, left_in, s, "send to the previous rank", "receive from the next rank");
      for (WorkHandle& w : scale_works) exec.wait(w, s, "scale_inv exchange");
      if (s == 0 && exchange_scales) {
        const float mine = *args.a.quantized.scale_inv;
        QMESH_CHECK(scale_from_prev == mine && scale_from_next == mine, exec.what(),
                    ": the neighbours' FP8 scale_inv (", scale_from_prev, ", ", scale_from_next,
                    ") differ from this rank's ", mine,
                    "; reduce the amax over the tensor-parallel group before quantizing");
      }
    }
  }
  if (chunk_amax) exec.max_of(args.d_amax, chunk_amax, n, kAmaxSlot);
  if (device_scales) {
    exec.compute_after(scales_ready);
    exec.poison_unless_same_scales(device_scales, r, args.d, args.d_amax);
  }
  // gathered's scales in the layout of [tokens, K] (every chunk arrived before its GEMM).
  for (int c = 0; block && c < n; ++c)
    copy_chunk_scales(exec, gathered.block.scale_inv, scale_slot(c), c, chunk, true);
}

void gemm_reduce_scatter(Communicator& comm, const GemmArgs& args, Overlap overlap,
                         const CollectiveGemmStreams& streams) {
  const char* op = "gemm_reduce_scatter";
  const Device device = check_common(args, streams, op);
  const auto current = overlap_detail::make_current(device);
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
  const bool block = args.a.is_block_scaled();
  const Shape own_scales = chunk_scale_shape(chunk, a.shape.cols());  // used when block
  {
    GemmArgs probe = args;
    // Block scaling: the first chunk's scale shape over A's scale memory (it is not run).
    probe.a = block
                  ? block_operand(a.rows(0, chunk), TensorView(args.a.block.scale_inv.data,
                                                               DType::kFloat32, own_scales, device))
                  : operand_rows(args.a, 0, chunk);
    check_gemm(probe, op);
  }
  RingExec exec(comm, device, streams, op);
  // Block scaling: every chunk's scales copied into its own layout first (chunk c at rows
  // [c·KB, (c+1)·KB)), padding zero.
  const int64_t kb = own_scales.rows();
  const TensorView chunk_scales =
      block ? exec.scratch(DType::kFloat32, Shape{n * kb, own_scales.cols()}) : TensorView();
  if (block) {
    exec.zero(chunk_scales);
    for (int c = 0; c < n; ++c)
      copy_chunk_scales(exec, args.a.block.scale_inv, chunk_scales.rows(c * kb, (c + 1) * kb), c,
                        chunk, false);
  }
  auto chunk_gemm = [&](int c, const TensorView& into) {
    const GemmOperand rows = block ? block_operand(a.rows(c * chunk, (c + 1) * chunk),
                                                   chunk_scales.rows(c * kb, (c + 1) * kb))
                                   : operand_rows(args.a, c * chunk, chunk);
    gemm_rows(exec, args, rows, into, 0, chunk);
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
    for (int c = 0; c < n; ++c) chunk_gemm(c, partial.rows(c * chunk, (c + 1) * chunk));
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
    if (overlap == Overlap::kNone) own = partial.rows(c * chunk, (c + 1) * chunk);
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
