// The cuBLASLt algorithms chosen so far, one per GEMM problem, so that a GEMM run again
// (every layer GEMM and collective-GEMM chunk, each step) skips the heuristic or the timing.
// Keys name the device, the cuBLASLt version and the whole problem (see gemm_cublaslt.cpp).
// Tuned choices may also live in a text file (QMESH_GEMM_AUTOTUNE_FILE) so that later
// processes skip the timing; one file can serve several GPUs and library versions.
// Thread-safe.
#pragma once

#include <cublasLt.h>

#include <optional>
#include <string>

namespace qmesh::detail {

// QMESH_GEMM_AUTOTUNE != 0: time every heuristic candidate once per problem.
bool gemm_autotune_enabled();

// How an algorithm was chosen: the heuristic's first candidate (kept in memory only), or
// the fastest candidate timed by autotuning (also appended to the cache file).
enum class AlgoChoice { kHeuristic, kTuned };

// The algorithm chosen earlier for `key` in the same way (this process, or for kTuned the
// cache file), if any.
std::optional<cublasLtMatmulAlgo_t> cached_gemm_algo(AlgoChoice how, const std::string& key);

// Records the choice for `key`.
void remember_gemm_algo(AlgoChoice how, const std::string& key, const cublasLtMatmulAlgo_t& algo);

}  // namespace qmesh::detail
