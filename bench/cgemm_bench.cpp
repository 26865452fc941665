// cgemm_bench: the collective GEMMs of qmesh/overlap against their parts, per tensor-parallel
// layer shape (M tokens, K in, N out features):
//   ag (column parallel, all-gather + GEMM): A chunk [M/tp, K], W [N/tp, K], D [M, N/tp]
//   rs (row parallel, GEMM + reduce-scatter): A [M, K/tp], W [N, K/tp], D [M/tp, N]
// For each it reports T_gemm_only (the tp chunk GEMMs alone), T_comm_only (the backend's
// collective alone: all_gather of the bf16 operand / reduce_scatter of the fp32 partial
// sums), T_none (Overlap::kNone),
// T_overlapped (kRing; kBidirectional too for ag), and the exposed-communication fraction
// (T_overlapped - T_gemm_only) / T_comm_only. Times: the slowest rank's median.
//
//   mpirun -np 4 cgemm_bench --backend mpi --json out.json
//   cgemm_bench --backend local --ranks 4 --scale 16
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "bench_util.h"
#include "bench_world.h"
#include "qmesh/comm/bootstrap.h"
#include "qmesh/comm/local.h"
#include "qmesh/config.h"
#include "qmesh/error.h"
#include "qmesh/float16.h"
#include "qmesh/overlap/collective_gemm.h"
#include "qmesh/random.h"

namespace {

using namespace qmesh;

struct Options {
  std::string backend = "mpi";
  int ranks = 4;   // local backend only
  int scale = 16;  // M, K, N divided by this (the full sizes are far too slow for a CPU)
  int iters = 5;   // timed repetitions (median reported)
  int warmup = 1;
  std::string json;
};

struct Result {
  std::string op, schedule;
  int64_t m, k, n;
  bench::CgemmTimes t;
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s [options]\n"
      "  --backend mpi|ucx|local  transport (mpi, ucx: run under mpirun; default mpi)\n"
      "  --ranks N             tp ranks (threads) of the local backend (default 4)\n"
      "  --scale S             divide M=8192, K=4096, N in {4096, 16384} by S (default 16)\n"
      "  --iters N             timed repetitions, median reported (default 5)\n"
      "  --warmup N            untimed repetitions (default 1)\n"
      "  --json FILE           also write the results as JSON\n"
      "  --help                this text\n",
      argv0);
}

Options parse(int argc, char** argv) {
  using bench::positive;
  Options o;
  bench::for_each_option(argc, argv, usage, [&](const std::string& arg, const std::string& value) {
    if (arg == "--backend")
      o.backend = value;
    else if (arg == "--ranks")
      o.ranks = positive(arg, value);
    else if (arg == "--scale")
      o.scale = positive(arg, value);
    else if (arg == "--iters")
      o.iters = positive(arg, value);
    else if (arg == "--warmup")
      o.warmup = static_cast<int>(bench::int_option(arg, value, 0));
    else if (arg == "--json")
      o.json = value;
    else
      QMESH_THROW("unknown option ", arg, " (see --help)");
  });
  QMESH_CHECK(o.backend == "mpi" || o.backend == "ucx" || o.backend == "local", "--backend ",
              o.backend, " is not one of mpi, ucx, local");
  return o;
}

// The slowest rank's median time of `fn` (see bench::slowest_median).
double time_fn(Communicator& comm, const Options& o, const std::function<void()>& fn) {
  return bench::slowest_median(comm, o.iters, o.warmup, fn);
}

Tensor random_bf16(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = counter_normal(seed, i);
  Tensor t(DType::kBFloat16, Shape{rows, cols});
  fp32_to_bf16(v.data(), static_cast<uint16_t*>(t.data()), v.size());
  return t;
}

using bench::rows;

// The tp chunk GEMMs that both collective GEMMs run, without communication.
void chunk_gemms(const GemmArgs& args, const TensorView& a, const TensorView& d, int tp,
                 bool d_per_chunk) {
  const int64_t chunk = a.shape.rows() / tp;
  for (int c = 0; c < tp; ++c) {
    GemmArgs step = args;
    step.a = GemmOperand::plain(rows(a, c * chunk, chunk));
    step.d = d_per_chunk ? rows(d, c * chunk, chunk) : d;
    gemm(step);
  }
}

std::vector<Result> run_all(Communicator& comm, const Options& o) {
  const int tp = comm.size();
  const int64_t m = 8192 / o.scale, k = 4096 / o.scale;
  QMESH_CHECK(m % tp == 0 && k % tp == 0, "--scale ", o.scale, " leaves M=", m, " K=", k,
              " not divisible by tp=", tp);
  std::vector<Result> out;
  for (int64_t n_full : {4096, 16384}) {
    const int64_t n = n_full / o.scale;
    QMESH_CHECK(n % tp == 0, "N=", n, " is not divisible by tp=", tp);
    {  // all-gather + GEMM (column parallel)
      const Tensor a = random_bf16(m / tp, k, 1 + comm.rank());
      const Tensor w = random_bf16(n / tp, k, 100 + comm.rank());
      const Tensor gathered(DType::kBFloat16, Shape{m, k});
      const Tensor d(DType::kFloat32, Shape{m, n / tp});
      GemmArgs args;
      args.a = GemmOperand::plain(a);
      args.b = GemmOperand::plain(w);
      args.d = d;
      const double gemm_only = time_fn(comm, o, [&] { chunk_gemms(args, gathered, d, tp, true); });
      const double comm_only = time_fn(comm, o, [&] { comm.all_gather(a, gathered); });
      auto run = [&](Overlap s) {
        return time_fn(comm, o,
                       [&] { all_gather_gemm(comm, args, GemmOperand::plain(gathered), s); });
      };
      const double none = run(Overlap::kNone);
      for (Overlap s : {Overlap::kRing, Overlap::kBidirectional})
        out.push_back(
            {"ag", std::string(overlap_name(s)), m, k, n, {gemm_only, comm_only, none, run(s)}});
    }
    {  // GEMM + reduce-scatter (row parallel)
      const Tensor a = random_bf16(m, k / tp, 1 + comm.rank());
      const Tensor w = random_bf16(n, k / tp, 100 + comm.rank());
      const Tensor partial(DType::kFloat32, Shape{m, n});
      const Tensor d(DType::kFloat32, Shape{m / tp, n});
      GemmArgs args;
      args.a = GemmOperand::plain(a);
      args.b = GemmOperand::plain(w);
      args.d = d;
      GemmArgs full = args;
      full.d = partial;
      const double gemm_only = time_fn(comm, o, [&] { chunk_gemms(full, a, partial, tp, true); });
      const double comm_only =
          time_fn(comm, o, [&] { comm.reduce_scatter(partial, d, ReduceOp::kSum); });
      auto run = [&](Overlap s) {
        return time_fn(comm, o, [&] { gemm_reduce_scatter(comm, args, s); });
      };
      out.push_back({"rs",
                     "ring",
                     m,
                     k,
                     n,
                     {gemm_only, comm_only, run(Overlap::kNone), run(Overlap::kRing)}});
    }
  }
  return out;
}

void report(const std::vector<Result>& results, const Options& o, int tp) {
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf(
      "# cgemm_bench: backend %s, tp %d, bf16 operands, fp32 output, scale 1/%d, host %s, %s\n",
      o.backend.c_str(), tp, o.scale, host_name().c_str(), date);
  std::printf("%-3s %-6s %6s %6s %6s %12s %12s %12s %12s %8s\n", "op", "sched", "M", "K", "N",
              "gemm_ms", "comm_ms", "none_ms", "overlap_ms", "exposed");
  for (const auto& r : results)
    std::printf("%-3s %-6s %6lld %6lld %6lld %12.3f %12.3f %12.3f %12.3f %8.3f\n", r.op.c_str(),
                r.schedule.c_str(), (long long)r.m, (long long)r.k, (long long)r.n,
                r.t.gemm_only * 1e3, r.t.comm_only * 1e3, r.t.none * 1e3, r.t.overlapped * 1e3,
                r.t.exposed());
  if (o.json.empty()) return;
  std::ofstream out(o.json);
  QMESH_CHECK(out.good(), "cannot write --json file '", o.json, "'");
  out << "{\n  \"backend\": \"" << o.backend << "\",\n  \"tp\": " << tp
      << ",\n  \"scale\": " << o.scale << ",\n  \"host\": \"" << host_name()
      << "\",\n  \"date\": \"" << date << "\",\n  \"results\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    out << "    {\"op\": \"" << r.op << "\", \"schedule\": \"" << r.schedule << "\", \"M\": " << r.m
        << ", \"K\": " << r.k << ", \"N\": " << r.n << ", " << r.t.json_members() << "}"
        << (i + 1 < results.size() ? ",\n" : "\n");
  }
  out << "  ]\n}\n";
}

}  // namespace

int main(int argc, char** argv) {
  return qmesh::bench::world_main("cgemm_bench", argc, argv, parse, run_all, report);
}
