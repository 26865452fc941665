// cgemm_gpu_bench: the collective GEMMs of qmesh/overlap on CUDA tensors, with tp virtual
// ranks (threads of the local backend) sharing one GPU, each with its own compute and comm
// streams; the local backend moves the chunks with device-to-device copies on the comm
// streams. Per tensor-parallel layer shape (M = 8192 tokens, K = 4096, N in
// {4096, 16384}), tp in {2, 4, 8}, BF16 and FP8 (e4m3, unit scales) operands:
//   ag (column parallel, all-gather + GEMM): A chunk [M/tp, K], W [N/tp, K], D [M, N/tp] bf16
//   rs (row parallel, GEMM + reduce-scatter): A [M, K/tp], W [N, K/tp], D [M/tp, N] fp32
// it reports T_gemm_only (the tp chunk GEMMs alone on the compute stream), T_comm_only (the
// ring's tp - 1 transfer steps alone: the same send_async/recv_async of the same chunks or
// fp32 partials, without GEMMs or sums), T_none (Overlap::kNone), T_overlapped (kRing, and
// kBidirectional for ag) and the exposed-communication fraction
// (T_overlapped - T_gemm_only) / T_comm_only. Every rank runs at once, so the GPU does the
// work of tp GPUs and the copies share its memory bandwidth with the GEMMs: a proxy for tp
// GPUs, not a measurement of them. Times: host clock from a barrier to the synchronization of
// the rank's streams, the slowest rank's median over the repetitions.
//   usage: cgemm_gpu_bench [--tp N] [--iters N] [--warmup N] [--json FILE] [--help]
// Exits 0 with "no GPU" on a machine without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "qmesh/comm/local.h"
#include "qmesh/copy.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/error.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "qmesh/overlap/collective_gemm.h"
#include "qmesh/owned_stream.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/random.h"

namespace {

using namespace qmesh;

const Device kGpu = Device::cuda(0);
constexpr int64_t kTokens = 8192, kHidden = 4096;

struct Options {
  int tp = 0;  // 0: 2, 4 and 8
  int iters = 10;
  int warmup = 2;
  std::string json;
};

struct Result {
  std::string op, dtype, schedule;
  int tp;
  int64_t m, k, n;
  bench::CgemmTimes t;
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s [options]\n"
      "  --tp N       virtual ranks on the GPU: 2, 4 or 8 (default: all three)\n"
      "  --iters N    timed repetitions, median reported (default 10)\n"
      "  --warmup N   untimed repetitions (default 2)\n"
      "  --json FILE  also write the results as JSON\n"
      "  --help       this text\n",
      argv0);
}

Options parse(int argc, char** argv) {
  using bench::positive;
  Options o;
  bench::for_each_option(argc, argv, usage, [&](const std::string& arg, const std::string& value) {
    if (arg == "--tp")
      o.tp = positive(arg, value);
    else if (arg == "--iters")
      o.iters = positive(arg, value);
    else if (arg == "--warmup")
      o.warmup = static_cast<int>(bench::int_option(arg, value, 0));
    else if (arg == "--json")
      o.json = value;
    else
      QMESH_THROW("unknown option ", arg, " (see --help)");
  });
  QMESH_CHECK(o.tp == 0 || o.tp == 2 || o.tp == 4 || o.tp == 8, "--tp ", o.tp,
              " is not one of 2, 4, 8");
  return o;
}

// One rank's compute and comm streams.
class RankStreams {
 public:
  CollectiveGemmStreams get() const { return {compute_.get(), comm_.get()}; }
  void sync() const {
    synchronize(kGpu, compute_.get());
    synchronize(kGpu, comm_.get());
  }

 private:
  OwnedStream compute_{kGpu}, comm_{kGpu};
};

// The slowest rank's median time of `fn` up to the end of the rank's stream work (see
// bench::slowest_median); each run, warm-up included, ends with the streams' synchronization.
double time_fn(Communicator& comm, const Options& o, const RankStreams& streams,
               const std::function<void()>& fn) {
  return bench::slowest_median(comm, o.iters, o.warmup, [&] {
    fn();
    streams.sync();
  });
}

// A [rows, cols] operand on the GPU with N(0, 1) values: bf16, or e4m3 codes with unit scales
// (the same on every rank, as the global amax reduction makes them).
struct Operand {
  Tensor plain;
  QuantizedTensor fp8;
  Operand(DType dtype, int64_t rows, int64_t cols, uint64_t seed) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (size_t i = 0; i < v.size(); ++i) v[i] = counter_normal(seed, i);
    std::vector<uint8_t> bytes(v.size() * dtype_size(dtype));
    void* dst = nullptr;
    if (is_fp8(dtype)) {
      fp32_to_fp8(v.data(), bytes.data(), v.size(), dtype, 1.0f);
      fp8 = QuantizedTensor(dtype, Shape{rows, cols}, kGpu, false);
      dst = fp8.data().data();
    } else {
      fp32_to_bf16(v.data(), reinterpret_cast<uint16_t*>(bytes.data()), v.size());
      plain = Tensor(dtype, Shape{rows, cols}, kGpu);
      dst = plain.data();
    }
    copy_bytes(dst, kGpu, bytes.data(), Device::host(), bytes.size());
  }
  // Storage for a gathered operand of this dtype.
  Operand(DType dtype, int64_t rows, int64_t cols) {
    if (is_fp8(dtype))
      fp8 = QuantizedTensor(dtype, Shape{rows, cols}, kGpu, false);
    else
      plain = Tensor(dtype, Shape{rows, cols}, kGpu);
  }
  GemmOperand op() const {
    return plain.data() ? GemmOperand::plain(plain) : GemmOperand::fp8(fp8.view());
  }
  TensorView bytes() const { return plain.data() ? plain.view() : fp8.data().view(); }
};

using bench::rows;

GemmOperand operand_rows(const GemmOperand& op, int64_t begin, int64_t count) {
  if (!op.is_quantized()) return GemmOperand::plain(rows(op.tensor, begin, count));
  QuantizedTensorView q = op.quantized;
  q.data = rows(q.data, begin, count);
  return GemmOperand::fp8(q);
}

// The tp chunk GEMMs of both collective GEMMs, without communication: chunk c of `a` into
// rows c of `d`.
void chunk_gemms(const GemmArgs& args, const GemmOperand& a, const TensorView& d, int tp,
                 Stream compute) {
  const int64_t chunk = d.shape.rows() / tp;
  for (int c = 0; c < tp; ++c) {
    GemmArgs step = args;
    step.a = operand_rows(a, c * chunk, chunk);
    step.d = rows(d, c * chunk, chunk);
    gemm(step, compute);
  }
}

// The ring's transfers alone: tp - 1 steps, each sending send_buf(s) to rank + 1 and
// receiving recv_buf(s) from rank - 1 on the comm stream.
void ring_transfers(Communicator& comm, const CollectiveGemmStreams& streams,
                    const std::function<TensorView(int)>& send_buf,
                    const std::function<TensorView(int)>& recv_buf) {
  const int n = comm.size(), r = comm.rank();
  for (int s = 0; s + 1 < n; ++s) {
    WorkHandle recv = comm.recv_async(recv_buf(s), (r + n - 1) % n, 7, streams.comm);
    WorkHandle send = comm.send_async(send_buf(s), (r + 1) % n, 7, streams.comm);
    send->wait();
    recv->wait();
  }
}

void run_rank(Communicator& comm, const Options& o, std::vector<Result>& out) {
  const int tp = comm.size(), r = comm.rank();
  const RankStreams streams;
  const Stream compute = streams.get().compute;
  const int64_t m = kTokens, k = kHidden;
  for (DType dtype : {DType::kBFloat16, DType::kFloat8E4M3}) {
    const char* dtype_label = is_fp8(dtype) ? "fp8" : "bf16";
    for (int64_t n : {int64_t(4096), int64_t(16384)}) {
      auto record = [&](const char* op, Overlap s, const bench::CgemmTimes& t) {
        if (r == 0) out.push_back({op, dtype_label, std::string(overlap_name(s)), tp, m, k, n, t});
      };
      {  // all-gather + GEMM (column parallel)
        const int64_t chunk = m / tp;
        const Operand a(dtype, chunk, k, 1 + uint64_t(r)), w(dtype, n / tp, k, 100 + uint64_t(r));
        const Operand gathered(dtype, m, k);
        const Tensor d(DType::kBFloat16, Shape{m, n / tp}, kGpu);
        GemmArgs args;
        args.a = a.op();
        args.b = w.op();
        args.d = d;
        const double gemm_only =
            time_fn(comm, o, streams, [&] { chunk_gemms(args, gathered.op(), d, tp, compute); });
        const TensorView g = gathered.bytes();
        const double comm_only = time_fn(comm, o, streams, [&] {
          ring_transfers(
              comm, streams.get(),
              [&](int s) { return rows(g, ((r - s + tp) % tp) * chunk, chunk); },
              [&](int s) { return rows(g, ((r - s - 1 + 2 * tp) % tp) * chunk, chunk); });
        });
        auto run = [&](Overlap s) {
          return time_fn(comm, o, streams,
                         [&] { all_gather_gemm(comm, args, gathered.op(), s, streams.get()); });
        };
        const double none = run(Overlap::kNone);
        for (Overlap s : {Overlap::kRing, Overlap::kBidirectional})
          record("ag", s, {gemm_only, comm_only, none, run(s)});
      }
      {  // GEMM + reduce-scatter (row parallel)
        const int64_t chunk = m / tp;
        const Operand a(dtype, m, k / tp, 1 + uint64_t(r)), w(dtype, n, k / tp, 100 + uint64_t(r));
        const Tensor partial(DType::kFloat32, Shape{m, n}, kGpu);
        const Tensor d(DType::kFloat32, Shape{chunk, n}, kGpu);
        const Tensor incoming(DType::kFloat32, Shape{chunk, n}, kGpu);
        GemmArgs args;
        args.a = a.op();
        args.b = w.op();
        args.d = d;
        const double gemm_only =
            time_fn(comm, o, streams, [&] { chunk_gemms(args, a.op(), partial, tp, compute); });
        const double comm_only = time_fn(comm, o, streams, [&] {
          ring_transfers(
              comm, streams.get(), [&](int s) { return rows(partial, s * chunk, chunk); },
              [&](int) { return incoming.view(); });
        });
        auto run = [&](Overlap s) {
          return time_fn(comm, o, streams,
                         [&] { gemm_reduce_scatter(comm, args, s, streams.get()); });
        };
        const double none = run(Overlap::kNone);
        record("rs", Overlap::kRing, {gemm_only, comm_only, none, run(Overlap::kRing)});
      }
    }
  }
}

void report(const std::vector<Result>& results, const Options& o, const std::string& device) {
  std::printf("device: %s; %d timed repetitions (median of the slowest rank), M=%lld K=%lld\n",
              device.c_str(), o.iters, (long long)kTokens, (long long)kHidden);
  std::printf("%-3s %-5s %-6s %3s %6s | %9s %9s %9s %10s | %8s\n", "op", "dtype", "sched", "tp",
              "N", "gemm_ms", "comm_ms", "none_ms", "overlap_ms", "exposed");
  for (const Result& r : results)
    std::printf("%-3s %-5s %-6s %3d %6lld | %9.3f %9.3f %9.3f %10.3f | %7.1f%%\n", r.op.c_str(),
                r.dtype.c_str(), r.schedule.c_str(), r.tp, (long long)r.n, r.t.gemm_only * 1e3,
                r.t.comm_only * 1e3, r.t.none * 1e3, r.t.overlapped * 1e3, 100 * r.t.exposed());
  std::ostringstream json;
  json << "{\"device\": \"" << device << "\", \"iters\": " << o.iters << ", \"results\": [";
  for (size_t i = 0; i < results.size(); ++i) {
    const Result& r = results[i];
    json << (i ? ", " : "") << "{\"op\": \"" << r.op << "\", \"dtype\": \"" << r.dtype
         << "\", \"schedule\": \"" << r.schedule << "\", \"tp\": " << r.tp << ", \"M\": " << r.m
         << ", \"K\": " << r.k << ", \"N\": " << r.n << ", " << r.t.json_members() << "}";
  }
  json << "]}";
  std::printf("%s\n", json.str().c_str());
  if (!o.json.empty()) std::ofstream(o.json) << json.str() << "\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse(argc, argv);
    if (cuda_device_count() == 0) {
      std::printf("no GPU: cgemm_gpu_bench needs a CUDA device; nothing was measured\n");
      return 0;
    }
    cudaDeviceProp prop{};
    QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
    std::vector<Result> results;
    for (int tp : {2, 4, 8}) {
      if (o.tp != 0 && o.tp != tp) continue;
      run_local_ranks(tp, [&](Communicator& comm) { run_rank(comm, o, results); });
    }
    report(results, o, prop.name);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cgemm_gpu_bench: %s\n", e.what());
    return 1;
  }
}
