#include "algorithms/ring.h"

#include <cstring>
#include <string>
#include <vector>

#include "algorithms/reduce.h"
#include "qmesh/error.h"
#include "timeout_text.h"

namespace qmesh::algorithms {

namespace {

using Clock = std::chrono::steady_clock;

// Waits for one transfer of a ring step with `peer`; on timeout the error names that peer
// (and the ranks that never joined, where the backend knows them).
void wait_for(const RingContext& ctx, Work& work, bool receiving, int peer,
              std::string_view where) {
  const auto start = Clock::now();
  try {
    work.wait(ctx.deadline.left());
  } catch (const Error& e) {
    if (!ctx.deadline.passed()) {
      QMESH_THROW_KIND(e.kind(), ctx.what, " failed in ", where, " (",
                       receiving ? "receiving from " : "sending to ",
                       comm_detail::peer_ranks({peer}, ctx.world_ranks), "): ", e.what());
    }
    std::string blame = comm_detail::ring_wait_text(
        receiving, peer, where, std::chrono::ceil<std::chrono::milliseconds>(Clock::now() - start),
        ctx.world_ranks);
    const std::vector<int> absent = ctx.absent ? ctx.absent() : std::vector<int>{};
    if (!absent.empty())
      blame = comm_detail::never_joined_text(absent, ctx.op, ctx.world_ranks) + "; " + blame;
    const std::string message =
        comm_detail::timeout_text(ctx.what, ctx.timeout, ctx.timeout_source) + ": " + blame;
    if (ctx.on_timeout) ctx.on_timeout(message);
    QMESH_THROW_KIND(ErrorKind::kTimeout, message);
  }
}

std::string ring_step(int step, int steps) {
  return detail::concat("step ", step + 1, " of ", steps, " of the ring");
}

// Sends `out_chunk` to the next rank while receiving `in_chunk` from the previous one, in
// step `where` of the ring.
void shift(const RingContext& ctx, const TensorView& out_chunk, const TensorView& in_chunk,
           std::string_view where) {
  const int next = (ctx.rank + 1) % ctx.size;
  const int prev = (ctx.rank + ctx.size - 1) % ctx.size;
  WorkHandle recv = ctx.p2p.recv_async(in_chunk, prev, ctx.tag);
  WorkHandle send = ctx.p2p.send_async(out_chunk, next, ctx.tag);
  wait_for(ctx, *send, false, next, where);
  wait_for(ctx, *recv, true, prev, where);
}

void require_host(const TensorView& t, std::string_view what) {
  QMESH_CHECK(t.device.is_host(), "ring collectives run on host buffers; ", what, " is on ",
              t.device.str());
}

// Ring reduce-scatter over `work` split into `chunk(c)` ranges; on return chunk `rank` of
// `work` holds the full reduction. `scratch` holds at least the largest chunk.
template <class ChunkFn>
void reduce_scatter_chunks(const RingContext& ctx, const TensorView& work, ChunkFn chunk,
                           std::vector<char>& scratch, ReduceOp op, int steps) {
  const int n = ctx.size;
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (ctx.rank - s - 1 + 2 * n) % n;
    const int recv_c = (ctx.rank - s - 2 + 2 * n) % n;
    const auto [send_begin, send_count] = chunk(send_c);
    const auto [recv_begin, recv_count] = chunk(recv_c);
    TensorView tmp(scratch.data(), work.dtype, Shape{recv_count});
    shift(ctx, work.slice(send_begin, Shape{send_count}), tmp, ring_step(s, steps));
    reduce_into(work.slice(recv_begin, Shape{recv_count}).data, tmp.data, recv_count, work.dtype,
                op);
  }
}

// Ring all-gather in place: chunk `rank` of `work` is this rank's; on return all are filled.
// `first_step`, `steps`: where these steps lie in the whole ring (for messages).
template <class ChunkFn>
void all_gather_chunks(const RingContext& ctx, const TensorView& work, ChunkFn chunk,
                       int first_step, int steps) {
  const int n = ctx.size;
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (ctx.rank - s + n) % n;
    const int recv_c = (ctx.rank - s - 1 + n) % n;
    const auto [send_begin, send_count] = chunk(send_c);
    const auto [recv_begin, recv_count] = chunk(recv_c);
    shift(ctx, work.slice(send_begin, Shape{send_count}), work.slice(recv_begin, Shape{recv_count}),
          ring_step(first_step + s, steps));
  }
}

}  // namespace

void ring_all_gather(const RingContext& ctx, const TensorView& in, const TensorView& out) {
  require_host(in, "the all_gather input");
  require_host(out, "the all_gather output");
  const int64_t m = in.numel();
  std::memmove(out.slice(ctx.rank * m, Shape{m}).data, in.data, in.nbytes());
  all_gather_chunks(
      ctx, out,
      [m](int c) {
        return std::pair<int64_t, int64_t>{c * m, m};
      },
      0, ctx.size - 1);
}

void ring_reduce_scatter(const RingContext& ctx, const TensorView& in, const TensorView& out,
                         ReduceOp op) {
  require_host(in, "the reduce_scatter input");
  require_host(out, "the reduce_scatter output");
  const int64_t m = out.numel();
  std::vector<char> work_bytes(in.nbytes());
  std::memcpy(work_bytes.data(), in.data, in.nbytes());
  TensorView work(work_bytes.data(), in.dtype, Shape{in.numel()});
  std::vector<char> scratch(out.nbytes());
  reduce_scatter_chunks(
      ctx, work,
      [m](int c) {
        return std::pair<int64_t, int64_t>{c * m, m};
      },
      scratch, op, ctx.size - 1);
  std::memcpy(out.data, work.slice(ctx.rank * m, Shape{m}).data, out.nbytes());
}

void ring_all_reduce(const RingContext& ctx, const TensorView& buf, ReduceOp op) {
  require_host(buf, "the all_reduce buffer");
  const int64_t total = buf.numel();
  const int n = ctx.size;
  auto chunk = [total, n](int c) {
    const int64_t begin = total * c / n;
    return std::pair<int64_t, int64_t>{begin, total * (c + 1) / n - begin};
  };
  // Ranks beyond the element count would exchange empty chunks, which TensorView cannot
  // express; a one-chunk-per-element ring is not worth it for such tiny buffers.
  if (total < n) {
    std::vector<char> gathered(buf.nbytes() * n);
    TensorView all(gathered.data(), buf.dtype, Shape{total * n});
    ring_all_gather(ctx, buf, all);
    std::memcpy(buf.data, gathered.data(), buf.nbytes());
    for (int r = 1; r < n; ++r)
      reduce_into(buf.data, all.slice(r * total, Shape{total}).data, total, buf.dtype, op);
    return;
  }
  std::vector<char> scratch((total / n + 1) * dtype_size(buf.dtype));
  reduce_scatter_chunks(ctx, buf, chunk, scratch, op, 2 * (n - 1));
  all_gather_chunks(ctx, buf, chunk, n - 1, 2 * (n - 1));
}

void ring_broadcast(const RingContext& ctx, const TensorView& buf, int root) {
  require_host(buf, "the broadcast buffer");
  const int next = (ctx.rank + 1) % ctx.size;
  const int prev = (ctx.rank + ctx.size - 1) % ctx.size;
  if (ctx.rank != root) {
    WorkHandle recv = ctx.p2p.recv_async(buf, prev, ctx.tag);
    wait_for(ctx, *recv, true, prev, "the broadcast chain");
  }
  if (next != root) {
    WorkHandle send = ctx.p2p.send_async(buf, next, ctx.tag);
    wait_for(ctx, *send, false, next, "the broadcast chain");
  }
}

void ring_barrier(const RingContext& ctx) {
  if (ctx.size == 1) return;
  int32_t token = 0;
  TensorView t(&token, DType::kInt32, Shape{1});
  // Pass 1 goes all the way round: rank 0 gets the token back only after every rank has
  // entered. Pass 2 (a chain from rank 0) tells the others.
  const int next = (ctx.rank + 1) % ctx.size;
  const int prev = (ctx.rank + ctx.size - 1) % ctx.size;
  const std::string_view pass = "pass 1 of the barrier";
  if (ctx.rank != 0) wait_for(ctx, *ctx.p2p.recv_async(t, prev, ctx.tag), true, prev, pass);
  wait_for(ctx, *ctx.p2p.send_async(t, next, ctx.tag), false, next, pass);
  if (ctx.rank == 0) wait_for(ctx, *ctx.p2p.recv_async(t, prev, ctx.tag), true, prev, pass);
  ring_broadcast(ctx, t, 0);
}

}  // namespace qmesh::algorithms
