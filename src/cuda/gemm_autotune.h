// The algorithm cache of GEMM autotuning: in memory, and optionally in a text file
// (QMESH_GEMM_AUTOTUNE_FILE) so that later processes skip the timing. Keys name the device,
// the cuBLASLt version and the whole problem (see gemm_cublaslt.cpp), so one file can serve
// several GPUs and library versions. Thread-safe.
#pragma once

#include <cublasLt.h>

#include <optional>
#include <string>

namespace qmesh::detail {

// QMESH_GEMM_AUTOTUNE != 0: time every heuristic candidate once per problem.
bool gemm_autotune_enabled();

// The algorithm chosen earlier for `key` (this process, or the cache file), if any.
std::optional<cublasLtMatmulAlgo_t> cached_gemm_algo(const std::string& key);

// Records the choice for `key` (and appends it to the cache file when one is configured).
void remember_gemm_algo(const std::string& key, const cublasLtMatmulAlgo_t& algo);

}  // namespace qmesh::detail
