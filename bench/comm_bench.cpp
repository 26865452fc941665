// comm_bench: latency and bus bandwidth of all-reduce, all-gather, reduce-scatter and
// point-to-point on the host backends (local threads; MPI and UCX under mpirun), for message sizes
// from --min-bytes to --max-bytes. Bandwidths follow nccl-tests:
//   algbw = size / time;  busbw = algbw * factor, with factor
//   all_reduce 2(n-1)/n, all_gather (n-1)/n, reduce_scatter (n-1)/n, sendrecv 1,
// where size is the all-reduce buffer, the all-gather output, the reduce-scatter input and
// the bytes each rank sends in sendrecv (a ring: send to r+1 while receiving from r-1).
// time is the slowest rank's mean over the timed iterations.
//
//   mpirun -np 4 comm_bench --backend mpi --json out.json
//   UCX_TLS=posix,cma,self mpirun -np 4 comm_bench --backend ucx   (MPI only bootstraps)
//   comm_bench --backend local --ranks 4
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

namespace {

using namespace qmesh;

struct Options {
  std::string backend = "mpi";
  int ranks = 4;  // local backend only
  int64_t min_bytes = 8;
  int64_t max_bytes = 64 << 20;
  int64_t bytes_per_size = 256 << 20;  // sets the iteration count of each size
  int warmup = 2;
  std::string json;
};

enum class Op { kAllReduce, kAllGather, kReduceScatter, kSendRecv };
constexpr Op kOps[] = {Op::kAllReduce, Op::kAllGather, Op::kReduceScatter, Op::kSendRecv};

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kSendRecv:
      return "sendrecv";
  }
  return "?";
}

double bus_factor(Op op, int n) {
  switch (op) {
    case Op::kAllReduce:
      return 2.0 * (n - 1) / n;
    case Op::kAllGather:
    case Op::kReduceScatter:
      return double(n - 1) / n;
    case Op::kSendRecv:
      return 1.0;
  }
  return 1.0;
}

struct Result {
  Op op;
  int64_t bytes;
  int iters;
  double seconds;  // per operation, slowest rank
  double algbw() const { return bytes / seconds / 1e9; }
};

void usage(const char* argv0) {
  std::printf(
      "usage: %s [options]\n"
      "  --backend mpi|ucx|local  transport (mpi, ucx: run under mpirun; default mpi)\n"
      "  --ranks N             ranks (threads) of the local backend (default 4)\n"
      "  --min-bytes B         smallest message (default 8; suffixes K, M)\n"
      "  --max-bytes B         largest message (default 64M); sizes double from min to max\n"
      "  --bytes-per-size B    data moved per size, sets iterations (default 256M)\n"
      "  --warmup N            untimed iterations per size (default 2)\n"
      "  --json FILE           also write the results as JSON\n"
      "  --help                this text\n",
      argv0);
}

int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  int64_t scale = 1;
  if (*end == 'K' || *end == 'k') scale = 1 << 10, ++end;
  if (*end == 'M' || *end == 'm') scale = 1 << 20, ++end;
  QMESH_CHECK(*end == '\0' && v > 0, "'", text, "' is not a byte count (e.g. 8, 4K, 64M)");
  return v * scale;
}

Options parse(int argc, char** argv) {
  Options o;
  bench::for_each_option(argc, argv, usage, [&](const std::string& arg, const std::string& value) {
    if (arg == "--backend") {
      o.backend = value;
    } else if (arg == "--ranks") {
      o.ranks = bench::positive(arg, value);
    } else if (arg == "--min-bytes") {
      o.min_bytes = parse_bytes(value);
    } else if (arg == "--max-bytes") {
      o.max_bytes = parse_bytes(value);
    } else if (arg == "--bytes-per-size") {
      o.bytes_per_size = parse_bytes(value);
    } else if (arg == "--warmup") {
      o.warmup = static_cast<int>(bench::int_option(arg, value, 0));
    } else if (arg == "--json") {
      o.json = value;
    } else {
      QMESH_THROW("unknown option ", arg, " (see --help)");
    }
  });
  QMESH_CHECK(o.backend == "mpi" || o.backend == "ucx" || o.backend == "local", "--backend ",
              o.backend, " is not one of mpi, ucx, local");
  QMESH_CHECK(o.ranks >= 1, "--ranks ", o.ranks, " must be >= 1");
  QMESH_CHECK(o.min_bytes <= o.max_bytes, "--min-bytes exceeds --max-bytes");
  return o;
}

// Element counts (fp32) of a run of nominal size `bytes`: `per_rank` is each rank's share
// (all-gather input, reduce-scatter output), `total` the size nccl-tests reports. Sizes too
// small for every rank to hold one element round up to one.
struct Counts {
  int64_t per_rank;
  int64_t total;
};

Counts counts_of(Op op, int64_t bytes, int n) {
  const bool sharded = op == Op::kAllGather || op == Op::kReduceScatter;
  const int64_t per_rank = std::max<int64_t>(1, bytes / 4 / (sharded ? n : 1));
  return {per_rank, sharded ? per_rank * n : per_rank};
}

// Runs one operation `iters` times and returns the slowest rank's mean time per operation.
double time_op(Communicator& comm, Op op, int64_t bytes, int iters, int warmup) {
  const int n = comm.size();
  const auto [per_rank, total] = counts_of(op, bytes, n);
  Tensor a(DType::kFloat32, Shape{total});
  Tensor b(DType::kFloat32, Shape{total});
  std::fill_n(a.data_as<float>(), total, 1.0f);
  std::fill_n(b.data_as<float>(), total, 0.0f);
  const TensorView chunk_a(a.data(), DType::kFloat32, Shape{per_rank});
  const TensorView chunk_b(b.data(), DType::kFloat32, Shape{per_rank});
  std::function<void()> run;
  switch (op) {
    case Op::kAllReduce:
      run = [&] { comm.all_reduce(a, ReduceOp::kSum); };
      break;
    case Op::kAllGather:
      run = [&] { comm.all_gather(chunk_a, b); };
      break;
    case Op::kReduceScatter:
      run = [&] { comm.reduce_scatter(a, chunk_b, ReduceOp::kSum); };
      break;
    case Op::kSendRecv:
      run = [&] {
        WorkHandle recv = comm.recv_async(chunk_b, (comm.rank() + n - 1) % n, 0);
        WorkHandle send = comm.send_async(chunk_a, (comm.rank() + 1) % n, 0);
        send->wait();
        recv->wait();
      };
      break;
  }
  for (int i = 0; i < warmup; ++i) run();
  comm.barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) run();
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  comm.all_reduce(TensorView(&seconds, DType::kFloat64, Shape{1}), ReduceOp::kMax);
  return seconds;
}

std::vector<Result> run_all(Communicator& comm, const Options& o) {
  std::vector<Result> results;
  for (Op op : kOps) {
    if (comm.size() == 1 && op == Op::kSendRecv) continue;
    for (int64_t bytes = o.min_bytes; bytes <= o.max_bytes; bytes *= 2) {
      const int64_t reported = 4 * counts_of(op, bytes, comm.size()).total;
      if (!results.empty() && results.back().op == op && results.back().bytes == reported) {
        continue;  // rounded up to the size already measured
      }
      const int iters = static_cast<int>(std::clamp<int64_t>(o.bytes_per_size / bytes, 5, 1000));
      results.push_back({op, reported, iters, time_op(comm, op, bytes, iters, o.warmup)});
    }
  }
  return results;
}

void report(const std::vector<Result>& results, const Options& o, int n) {
  char date[64];
  const std::time_t now = std::time(nullptr);
  std::strftime(date, sizeof(date), "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf("# comm_bench: backend %s, %d ranks, fp32, host %s, %s\n", o.backend.c_str(), n,
              host_name().c_str(), date);
  std::printf("%-15s %12s %7s %12s %12s %12s\n", "op", "bytes", "iters", "time_us", "algbw_GB/s",
              "busbw_GB/s");
  for (const auto& r : results) {
    std::printf("%-15s %12lld %7d %12.2f %12.3f %12.3f\n", op_name(r.op),
                static_cast<long long>(r.bytes), r.iters, r.seconds * 1e6, r.algbw(),
                r.algbw() * bus_factor(r.op, n));
  }
  if (o.json.empty()) return;
  std::ofstream out(o.json);
  QMESH_CHECK(out.good(), "cannot write --json file '", o.json, "'");
  out << "{\n  \"backend\": \"" << o.backend << "\",\n  \"ranks\": " << n
      << ",\n  \"dtype\": \"fp32\",\n  \"host\": \"" << host_name() << "\",\n  \"date\": \"" << date
      << "\",\n  \"results\": [\n";
  for (size_t i = 0; i < results.size(); ++i) {
    const auto& r = results[i];
    out << "    {\"op\": \"" << op_name(r.op) << "\", \"bytes\": " << r.bytes
        << ", \"iters\": " << r.iters << ", \"time_us\": " << r.seconds * 1e6
        << ", \"algbw_GBps\": " << r.algbw()
        << ", \"busbw_GBps\": " << r.algbw() * bus_factor(r.op, n) << "}"
        << (i + 1 < results.size() ? ",\n" : "\n");
  }
  out << "  ]\n}\n";
}

}  // namespace

int main(int argc, char** argv) {
  return qmesh::bench::world_main("comm_bench", argc, argv, parse, run_all, report);
}
