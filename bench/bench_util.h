// Helpers shared by the plain benchmark programs: "--option value" command lines with
// --help, the slowest rank's median time, row views of a matrix.
#pragma once

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/error.h"
#include "qmesh/tensor.h"

namespace qmesh::bench {

// Calls set(option, value) for each "--option value" pair of argv, in order. "--help" or
// "-h" prints usage(argv[0]) and exits with status 0. Error for an option without a value;
// `set` throws for an option it does not know.
inline void for_each_option(
    int argc, char** argv, const std::function<void(const char*)>& usage,
    const std::function<void(const std::string&, const std::string&)>& set) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage(argv[0]);
      std::exit(0);
    }
    QMESH_CHECK(i + 1 < argc, "option ", arg, " needs a value (see --help)");
    set(arg, argv[++i]);
  }
}

// The value of option `arg` as a whole integer >= `min` ("12x", "" and out-of-range values are
// an Error naming the option).
inline int64_t int_option(const std::string& arg, const std::string& value, int64_t min) {
  int64_t v = 0;
  const char* end = value.data() + value.size();
  const auto [ptr, ec] = std::from_chars(value.data(), end, v);
  QMESH_CHECK(ec == std::errc() && ptr == end && v >= min, arg, " must be an integer >= ", min,
              ", got '", value, "'");
  return v;
}
// int_option(arg, value, 1) as an int.
inline int positive(const std::string& arg, const std::string& value) {
  const int64_t v = int_option(arg, value, 1);
  QMESH_CHECK(v <= INT32_MAX, arg, " is too large: ", value);
  return static_cast<int>(v);
}

// The options of the benchmarks that take only "--iters N" (>= 1) and "--json FILE": sets
// `iters` and `json_path`, leaving the defaults for options not given (for_each_option's
// --help and errors).
inline void iters_and_json_options(int argc, char** argv,
                                   const std::function<void(const char*)>& usage, int& iters,
                                   std::string& json_path) {
  for_each_option(argc, argv, usage, [&](const std::string& arg, const std::string& value) {
    if (arg == "--iters")
      iters = positive(arg, value);
    else if (arg == "--json")
      json_path = value;
    else
      QMESH_THROW("unknown option ", arg, " (see --help)");
  });
}

// The slowest rank's median time in seconds of `fn` over `iters` runs, each started after
// a barrier, after `warmup` untimed runs. Collective over `comm`.
inline double slowest_median(Communicator& comm, int iters, int warmup,
                             const std::function<void()>& fn) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> times;
  for (int i = 0; i < iters; ++i) {
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    fn();
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  double t = times[times.size() / 2];
  comm.all_reduce(TensorView(&t, DType::kFloat64, Shape{1}), ReduceOp::kMax);
  return t;
}

// The times of one collective-GEMM measurement, in seconds.
struct CgemmTimes {
  double gemm_only = 0;   // the chunk GEMMs alone
  double comm_only = 0;   // the communication alone
  double none = 0;        // Overlap::kNone
  double overlapped = 0;  // the overlapped schedule
  // The exposed-communication fraction (T_overlapped - T_gemm_only) / T_comm_only.
  double exposed() const { return (overlapped - gemm_only) / comm_only; }
  // "gemm_only_ms": ..., "comm_only_ms": ..., "none_ms": ..., "overlapped_ms": ...,
  // "exposed": ... (JSON object members, no braces).
  std::string json_members() const {
    std::ostringstream s;
    s << "\"gemm_only_ms\": " << gemm_only * 1e3 << ", \"comm_only_ms\": " << comm_only * 1e3
      << ", \"none_ms\": " << none * 1e3 << ", \"overlapped_ms\": " << overlapped * 1e3
      << ", \"exposed\": " << exposed();
    return s.str();
  }
};

// Rows [begin, begin + count) of a row-major 2-D tensor (host or device).
inline TensorView rows(const TensorView& t, int64_t begin, int64_t count) {
  const int64_t cols = t.shape.cols();
  auto* base = static_cast<char*>(t.data) + begin * cols * int64_t(dtype_size(t.dtype));
  return TensorView(base, t.dtype, Shape{count, cols}, t.device);
}

}  // namespace qmesh::bench
