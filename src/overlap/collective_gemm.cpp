#include "qmesh/overlap/collective_gemm.h"

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "qmesh/error.h"

namespace qmesh {

namespace {

using Clock = std::chrono::steady_clock;

// Tags of the rings' point-to-point messages (a communicator must not carry other traffic
// with these tags while a collective GEMM runs).
constexpr int kTagRight = 0x5100;  // chunks moving to rank + 1
constexpr int kTagLeft = 0x5101;   // chunks moving to rank - 1
constexpr int kTagScaleRight = 0x5102;
constexpr int kTagScaleLeft = 0x5103;
constexpr int kTagPartial = 0x5104;  // partial sums of the reduce-scatter ring

// Rows [begin, begin + count) of a row-major 2-D host tensor.
TensorView rows_of(const TensorView& t, int64_t begin, int64_t count) {
  const int64_t cols = t.shape.cols();
  auto* base =
      static_cast<char*>(t.data) + begin * cols * static_cast<int64_t>(dtype_size(t.dtype));
  return TensorView(base, t.dtype, Shape{count, cols}, t.device);
}

const TensorView& operand_data(const GemmOperand& op) {
  return op.is_quantized() ? op.quantized.data : op.tensor;
}

GemmOperand operand_rows(const GemmOperand& op, int64_t begin, int64_t count) {
  if (!op.is_quantized()) return GemmOperand::plain(rows_of(op.tensor, begin, count));
  QuantizedTensorView q = op.quantized;
  q.data = rows_of(q.data, begin, count);
  q.data_t = TensorView();
  return GemmOperand::fp8(q);
}

// One step's GEMM: `a_rows` times B into `d_rows` (and aux rows [begin, begin + count) when
// the epilogue uses aux).
void gemm_rows(const GemmArgs& args, const GemmOperand& a_rows, const TensorView& d_rows,
               int64_t begin, int64_t count) {
  GemmArgs step = args;
  step.a = a_rows;
  step.d = d_rows;
  if (!args.aux.empty()) step.aux = rows_of(args.aux, begin, count);
  gemm(step);
}

// Waits bounded by one deadline for the whole collective, so that a dead peer ends it after
// comm_timeout() whatever the number of steps.
class Waiter {
 public:
  explicit Waiter(std::string what)
      : what_(std::move(what)), deadline_(Clock::now() + comm_timeout()) {}

  void wait(WorkHandle& work, int step, std::string_view transfer) const {
    if (!work) return;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now());
    try {
      work->wait(std::max(left, std::chrono::milliseconds(0)));
    } catch (const Error& e) {
      QMESH_THROW(what_, " failed at step ", step, " (", transfer, "): ", e.what());
    }
    work.reset();
  }
  const std::string& what() const { return what_; }

 private:
  std::string what_;
  Clock::time_point deadline_;
};

std::string describe(const char* op, const Communicator& comm) {
  return std::string(op) + " (rank " + std::to_string(comm.rank()) + " of " +
         std::to_string(comm.size()) + ")";
}

void check_common(const GemmArgs& args, const char* op) {
  QMESH_CHECK(args.trans_a == GemmTranspose::kNo, op,
              ": A must be stored [tokens, K] (trans_a kNo), got trans_a kYes");
  QMESH_CHECK(args.a.device().is_host() && args.d.device.is_host(), op,
              ": collective GEMMs run on host tensors; A is on ", args.a.device().str(),
              " and D on ", args.d.device.str());
  QMESH_CHECK(args.epilogue != GemmEpilogue::kBiasGrad, op,
              ": the kBiasGrad epilogue sums over the token chunks and cannot be split");
}

void check_gemm(const GemmArgs& probe, const char* op) {
  const Status st = Gemm::can_implement(probe);
  QMESH_CHECK(st.ok(), op, ": ", st.reason());
}

int mod(int x, int n) { return ((x % n) + n) % n; }

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
                     Overlap overlap) {
  const char* op = "all_gather_gemm";
  check_common(args, op);
  const int n = comm.size(), r = comm.rank();
  const TensorView& a = operand_data(args.a);
  const TensorView& g = operand_data(gathered);
  const int64_t chunk = a.shape.rows(), k = a.shape.cols(), tokens = chunk * n;
  QMESH_CHECK(gathered.is_quantized() == args.a.is_quantized() && g.dtype == a.dtype, op,
              ": gathered must have A's dtype ", dtype_name(a.dtype), ", got ",
              dtype_name(g.dtype));
  QMESH_CHECK(g.device.is_host(), op, ": gathered must be a host tensor, got ", g.device.str());
  QMESH_CHECK(!gathered.is_quantized() || !gathered.quantized.has_columnwise(), op,
              ": gathered FP8 storage must not have a columnwise copy (host only)");
  QMESH_CHECK(g.shape.rows() == tokens && g.shape.cols() == k, op, ": gathered must be [", tokens,
              ", ", k, "] (tp=", n, " chunks of A ", a.shape.str(), "), got ", g.shape.str());
  QMESH_CHECK(args.d.shape.rows() == tokens, op, ": D must have ", tokens, " rows (tp=", n, " x ",
              chunk, " tokens), got shape ", args.d.shape.str());
  QMESH_CHECK(!args.aux.empty() || (args.epilogue != GemmEpilogue::kBiasGeluAux &&
                                    args.epilogue != GemmEpilogue::kDGelu),
              op, ": the epilogue needs aux");
  QMESH_CHECK(args.aux.empty() || args.aux.shape.rows() == tokens, op, ": aux must have ", tokens,
              " rows, got shape ", args.aux.shape.str());
  {  // B, the epilogue and D's columns are checked on the first chunk, before any transfer.
    GemmArgs probe = args;
    probe.d = rows_of(args.d, 0, chunk);
    if (!args.aux.empty()) probe.aux = rows_of(args.aux, 0, chunk);
    check_gemm(probe, op);
  }
  const char* a_begin = static_cast<const char*>(a.data);
  const char* g_begin = static_cast<const char*>(g.data);
  QMESH_CHECK(a_begin + a.nbytes() <= g_begin || g_begin + g.nbytes() <= a_begin, op,
              ": A must not overlap the gathered storage");
  if (gathered.is_quantized()) {
    const QuantizedTensorView& qa = args.a.quantized;
    const QuantizedTensorView& qg = gathered.quantized;
    *qg.scale = *qa.scale;
    *qg.scale_inv = *qa.scale_inv;
    if (qg.amax && qa.amax) *qg.amax = *qa.amax;
  }
  auto chunk_gemm = [&](int c) {
    gemm_rows(args, operand_rows(gathered, c * chunk, chunk), rows_of(args.d, c * chunk, chunk),
              c * chunk, chunk);
  };
  if (overlap == Overlap::kNone || n == 1) {
    comm.all_gather(a, g);
    if (gathered.is_quantized() && n > 1) {
      std::vector<float> scales(static_cast<size_t>(n));
      comm.all_gather(TensorView(args.a.quantized.scale_inv, DType::kFloat32, Shape{1}),
                      TensorView(scales.data(), DType::kFloat32, Shape{n}));
      for (int p = 0; p < n; ++p)
        QMESH_CHECK(scales[p] == *args.a.quantized.scale_inv, op, ": rank ", p, "'s FP8 scale_inv ",
                    scales[p], " differs from this rank's ", *args.a.quantized.scale_inv,
                    "; reduce the amax over the tensor-parallel group before quantizing");
    }
    for (int c = 0; c < n; ++c) chunk_gemm(c);
    return;
  }
  std::memcpy(rows_of(g, r * chunk, chunk).data, a.data, a.nbytes());
  // Chunks moving right (from rank - 1) and left (from rank + 1): h_right + h_left = n - 1.
  const int h_right = overlap == Overlap::kRing ? n - 1 : n / 2;
  const int h_left = n - 1 - h_right;
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const Waiter waiter(describe(op, comm));
  float scale_from_prev = 0, scale_from_next = 0;
  TensorView scale_prev_view(&scale_from_prev, DType::kFloat32, Shape{1});
  TensorView scale_next_view(&scale_from_next, DType::kFloat32, Shape{1});
  for (int s = 0; s <= h_right; ++s) {
    WorkHandle recv_right, send_right, recv_left, send_left, scale_works[4];
    if (s < h_right) {
      recv_right = comm.recv_async(rows_of(g, mod(r - s - 1, n) * chunk, chunk), prev, kTagRight);
      send_right = comm.send_async(rows_of(g, mod(r - s, n) * chunk, chunk), next, kTagRight);
    }
    if (s < h_left) {
      recv_left = comm.recv_async(rows_of(g, mod(r + s + 1, n) * chunk, chunk), next, kTagLeft);
      send_left = comm.send_async(rows_of(g, mod(r + s, n) * chunk, chunk), prev, kTagLeft);
    }
    if (s == 0 && gathered.is_quantized()) {
      const TensorView mine(args.a.quantized.scale_inv, DType::kFloat32, Shape{1});
      scale_works[0] = comm.recv_async(scale_prev_view, prev, kTagScaleRight);
      scale_works[1] = comm.send_async(mine, next, kTagScaleRight);
      scale_works[2] = comm.recv_async(scale_next_view, next, kTagScaleLeft);
      scale_works[3] = comm.send_async(mine, prev, kTagScaleLeft);
    }
    chunk_gemm(mod(r - s, n));
    if (s >= 1 && s <= h_left) chunk_gemm(mod(r + s, n));
    waiter.wait(send_right, s, "send to the next rank");
    waiter.wait(recv_right, s, "receive from the previous rank");
    waiter.wait(send_left, s, "send to the previous rank");
    waiter.wait(recv_left, s, "receive from the next rank");
    for (WorkHandle& w : scale_works) waiter.wait(w, s, "scale_inv exchange");
    if (s == 0 && gathered.is_quantized()) {
      const float mine = *args.a.quantized.scale_inv;
      QMESH_CHECK(scale_from_prev == mine && scale_from_next == mine, waiter.what(),
                  ": the neighbours' FP8 scale_inv (", scale_from_prev, ", ", scale_from_next,
                  ") differ from this rank's ", mine,
                  "; reduce the amax over the tensor-parallel group before quantizing");
    }
  }
}

void gemm_reduce_scatter(Communicator& comm, const GemmArgs& args, Overlap overlap) {
  const char* op = "gemm_reduce_scatter";
  check_common(args, op);
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
  {
    GemmArgs probe = args;
    probe.a = operand_rows(args.a, 0, chunk);
    check_gemm(probe, op);
  }
  auto chunk_gemm = [&](int c, const TensorView& into) {
    gemm_rows(args, operand_rows(args.a, c * chunk, chunk), into, 0, chunk);
  };
  if (n == 1) {
    chunk_gemm(0, args.d);
    return;
  }
  // kNone computes every partial first; the reduction is the same ring either way, so that
  // the sums are added in one order on every backend (docs/design/overlap.md).
  Tensor partial;
  if (overlap == Overlap::kNone) {
    partial = Tensor(DType::kFloat32, Shape{tokens, cols});
    for (int c = 0; c < n; ++c) chunk_gemm(c, rows_of(partial, c * chunk, chunk));
  }
  // Step s computes this rank's partial of chunk (r - s - 1) mod n and adds the running sum
  // of the same chunk received from rank - 1 (which started it one step earlier); the sum
  // goes on to rank + 1, until at step n - 1 rank r adds its own chunk's last term:
  // chunk c = ((P[c+1] + P[c+2]) + ...) + P[c].
  const int next = mod(r + 1, n), prev = mod(r - 1, n);
  const Waiter waiter(describe(op, comm));
  Tensor mine(DType::kFloat32, Shape{chunk, cols});
  Tensor incoming(DType::kFloat32, Shape{chunk, cols});
  Tensor outgoing[2] = {Tensor(DType::kFloat32, Shape{chunk, cols}),
                        Tensor(DType::kFloat32, Shape{chunk, cols})};
  WorkHandle send;
  const int64_t count = chunk * cols;
  for (int s = 0; s < n; ++s) {
    const int c = mod(r - s - 1, n);
    WorkHandle recv;
    if (s > 0) recv = comm.recv_async(incoming, prev, kTagPartial);
    TensorView own = s == 0 ? TensorView(outgoing[0]) : TensorView(mine);
    if (overlap == Overlap::kNone)
      own = rows_of(partial, c * chunk, chunk);
    else
      chunk_gemm(c, own);
    waiter.wait(recv, s, "receive from the previous rank");
    // The send of step s - 1 reads the other buffer; the one of step s - 2 (this buffer)
    // was waited for in step s - 1.
    TensorView target = own;
    if (s > 0) {
      target = s == n - 1 ? args.d : TensorView(outgoing[s % 2]);
      float* t = target.data_as<float>();
      const float* in = incoming.data_as<float>();
      const float* m = own.data_as<float>();
      for (int64_t i = 0; i < count; ++i) t[i] = in[i] + m[i];
    }
    waiter.wait(send, s, "send to the next rank");
    if (s < n - 1) send = comm.send_async(target, next, kTagPartial);
  }
}

}  // namespace qmesh
