// The CUDA GEMM backend on cuBLASLt (cuda/gemm_cublaslt.cpp, compiled only with
// QMESH_WITH_CUDA; ops/gemm.cpp calls it through qmesh/detail/cuda_dispatch.h).
#pragma once

#include <cstddef>
#include <memory>

#include "ops/gemm_canonical.h"

namespace qmesh::detail {

// cuBLASLt's workspace per stream (what Hopper's FP8 kernels are tuned for).
inline constexpr size_t kCublasLtWorkspaceBytes = size_t(32) << 20;
// cuBLASLt needs its workspace 256-byte aligned (cudaMalloc's alignment).
inline constexpr size_t kCublasLtWorkspaceAlignment = 256;

// One planned cuBLASLt matmul: descriptors built and an algorithm chosen (the heuristic's
// first candidate, or the fastest one when autotuning is on; either is asked for once per
// problem and then taken from gemm_algo_cache.h) at construction; run() enqueues it. The
// device of `c` must be usable.
class CublasLtGemm {
 public:
  // `stream` (cudaStream_t) is where autotuning, if on, times the candidates. Error if an FP8
  // scale or amax pointer of `c` is not in the memory of c's device.
  CublasLtGemm(const CanonicalGemm& c, void* stream);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  // Throws qmesh::Error unless cuBLASLt has an algorithm for `c` on its device (builds the
  // descriptors and asks the heuristic; launches nothing).
  static void check_supported(const CanonicalGemm& c);

  // Enqueues the GEMM on `stream`. `workspace` is kCublasLtWorkspaceBytes on c's device, or
  // nullptr for the cached workspace of (device, stream).
  void run(void* stream, void* workspace);

  // Enqueues `c` on `stream` with the process-wide plan of its problem (gemm_problem): built
  // (descriptors, algorithm) on the problem's first call, re-pointed at c's tensors on every
  // later one. The scalar pointers are not checked (they must be in the memory of c's
  // device). `workspace` as for run(). Thread-safe.
  static void run_planned(const CanonicalGemm& c, void* stream, void* workspace);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace qmesh::detail
