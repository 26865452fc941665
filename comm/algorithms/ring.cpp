#include "algorithms/ring.h"

#include <cstring>
#include <vector>

#include "algorithms/reduce.h"
#include "qmesh/error.h"

namespace qmesh::algorithms {

namespace {

using Clock = std::chrono::steady_clock;

// A contiguous range of elements of a host tensor, as its own 1-D view.
TensorView slice(const TensorView& t, int64_t begin, int64_t count) {
  auto* base = static_cast<char*>(t.data) + begin * static_cast<int64_t>(dtype_size(t.dtype));
  return TensorView(base, t.dtype, Shape{count}, t.device);
}

std::chrono::milliseconds remaining(const RingContext& ctx) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(ctx.deadline - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

void wait_for(const RingContext& ctx, Work& work, std::string_view step) {
  try {
    work.wait(remaining(ctx));
  } catch (const Error& e) {
    QMESH_THROW(ctx.what, " failed in ", step, ": ", e.what());
  }
}

// Sends `out_chunk` to the next rank while receiving `in_chunk` from the previous one.
void shift(const RingContext& ctx, const TensorView& out_chunk, const TensorView& in_chunk) {
  const int next = (ctx.rank + 1) % ctx.size;
  const int prev = (ctx.rank + ctx.size - 1) % ctx.size;
  WorkHandle recv = ctx.p2p.recv_async(in_chunk, prev, ctx.tag);
  WorkHandle send = ctx.p2p.send_async(out_chunk, next, ctx.tag);
  wait_for(ctx, *send, "a send to the next rank");
  wait_for(ctx, *recv, "a receive from the previous rank");
}

void require_host(const TensorView& t, std::string_view what) {
  QMESH_CHECK(t.device.is_host(), "ring collectives run on host buffers; ", what, " is on ",
              t.device.str());
}

// Ring reduce-scatter over `work` split into `chunk(c)` ranges; on return chunk `rank` of
// `work` holds the full reduction. `scratch` holds at least the largest chunk.
template <class ChunkFn>
void reduce_scatter_chunks(const RingContext& ctx, const TensorView& work, ChunkFn chunk,
                           std::vector<char>& scratch, ReduceOp op) {
  const int n = ctx.size;
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (ctx.rank - s - 1 + 2 * n) % n;
    const int recv_c = (ctx.rank - s - 2 + 2 * n) % n;
    const auto [send_begin, send_count] = chunk(send_c);
    const auto [recv_begin, recv_count] = chunk(recv_c);
    TensorView tmp(scratch.data(), work.dtype, Shape{recv_count});
    shift(ctx, slice(work, send_begin, send_count), tmp);
    reduce_into(slice(work, recv_begin, recv_count).data, tmp.data, recv_count, work.dtype, op);
  }
}

// Ring all-gather in place: chunk `rank` of `work` is this rank's; on return all are filled.
template <class ChunkFn>
void all_gather_chunks(const RingContext& ctx, const TensorView& work, ChunkFn chunk) {
  const int n = ctx.size;
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (ctx.rank - s + n) % n;
    const int recv_c = (ctx.rank - s - 1 + n) % n;
    const auto [send_begin, send_count] = chunk(send_c);
    const auto [recv_begin, recv_count] = chunk(recv_c);
    shift(ctx, slice(work, send_begin, send_count), slice(work, recv_begin, recv_count));
  }
}

}  // namespace

void ring_all_gather(const RingContext& ctx, const TensorView& in, const TensorView& out) {
  require_host(in, "the all_gather input");
  require_host(out, "the all_gather output");
  const int64_t m = in.numel();
  std::memmove(slice(out, ctx.rank * m, m).data, in.data, in.nbytes());
  all_gather_chunks(ctx, out, [m](int c) { return std::pair<int64_t, int64_t>{c * m, m}; });
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
      scratch, op);
  std::memcpy(out.data, slice(work, ctx.rank * m, m).data, out.nbytes());
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
      reduce_into(buf.data, slice(all, r * total, total).data, total, buf.dtype, op);
    return;
  }
  std::vector<char> scratch((total / n + 1) * dtype_size(buf.dtype));
  reduce_scatter_chunks(ctx, buf, chunk, scratch, op);
  all_gather_chunks(ctx, buf, chunk);
}

void ring_broadcast(const RingContext& ctx, const TensorView& buf, int root) {
  require_host(buf, "the broadcast buffer");
  const int next = (ctx.rank + 1) % ctx.size;
  const int prev = (ctx.rank + ctx.size - 1) % ctx.size;
  if (ctx.rank != root) {
    WorkHandle recv = ctx.p2p.recv_async(buf, prev, ctx.tag);
    wait_for(ctx, *recv, "a receive from the previous rank");
  }
  if (next != root) {
    WorkHandle send = ctx.p2p.send_async(buf, next, ctx.tag);
    wait_for(ctx, *send, "a send to the next rank");
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
  if (ctx.rank != 0) wait_for(ctx, *ctx.p2p.recv_async(t, prev, ctx.tag), "barrier pass 1");
  wait_for(ctx, *ctx.p2p.send_async(t, next, ctx.tag), "barrier pass 1");
  if (ctx.rank == 0) wait_for(ctx, *ctx.p2p.recv_async(t, prev, ctx.tag), "barrier pass 1");
  ring_broadcast(ctx, t, 0);
}

}  // namespace qmesh::algorithms
