#include "cuda/gemm_algo_cache.h"

#include <cstdint>
#include <fstream>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>

#include "qmesh/logging.h"
#include "qmesh/param.h"

namespace qmesh::detail {

namespace {

// One line per entry: the key, a tab, then the algorithm's opaque words in hex.
constexpr int kAlgoWords = sizeof(cublasLtMatmulAlgo_t) / sizeof(uint64_t);
static_assert(sizeof(cublasLtMatmulAlgo_t) == kAlgoWords * sizeof(uint64_t));

std::string cache_file() { return param_string("GEMM_AUTOTUNE_FILE", ""); }

struct Cache {
  std::mutex mutex;
  std::map<std::string, cublasLtMatmulAlgo_t> heuristic;
  std::map<std::string, cublasLtMatmulAlgo_t> tuned;
  bool loaded = false;

  // Reads the cache file once; lines that do not parse are skipped (a stale or foreign file
  // must not stop a run; a skipped entry is simply tuned again).
  void load_locked() {
    if (loaded) return;
    loaded = true;
    const std::string path = cache_file();
    if (path.empty()) return;
    std::ifstream in(path);
    std::string line;
    int entries = 0;
    while (std::getline(in, line)) {
      const size_t tab = line.rfind('\t');
      if (tab == std::string::npos) continue;
      std::istringstream words(line.substr(tab + 1));
      cublasLtMatmulAlgo_t algo{};
      int read = 0;
      while (read < kAlgoWords && (words >> std::hex >> algo.data[read])) ++read;
      if (read != kAlgoWords) continue;
      tuned[line.substr(0, tab)] = algo;
      ++entries;
    }
    QMESH_LOG_INFO("GEMM autotune cache ", path, ": ", entries, " entries");
  }
};

Cache& cache() {
  static Cache* c = new Cache;  // never destroyed: used until process exit
  return *c;
}

}  // namespace

bool gemm_autotune_enabled() { return param_int("GEMM_AUTOTUNE", 0) != 0; }

std::optional<cublasLtMatmulAlgo_t> cached_gemm_algo(AlgoChoice how, const std::string& key) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  if (how == AlgoChoice::kTuned) c.load_locked();
  const auto& algos = how == AlgoChoice::kTuned ? c.tuned : c.heuristic;
  const auto it = algos.find(key);
  if (it == algos.end()) return std::nullopt;
  return it->second;
}

void remember_gemm_algo(AlgoChoice how, const std::string& key, const cublasLtMatmulAlgo_t& algo) {
  Cache& c = cache();
  std::lock_guard lock(c.mutex);
  if (how == AlgoChoice::kHeuristic) {
    c.heuristic[key] = algo;
    return;
  }
  c.load_locked();
  c.tuned[key] = algo;
  const std::string path = cache_file();
  if (path.empty()) return;
  std::ofstream out(path, std::ios::app);
  out << key << '\t' << std::hex;
  for (int i = 0; i < kAlgoWords; ++i) out << (i ? " " : "") << algo.data[i];
  out << '\n';
  if (!out) QMESH_LOG_WARN("could not append to the GEMM autotune cache ", path);
}

}  // namespace qmesh::detail
