// Plain C entry points of the handler library that the Python package calls through ctypes
// when it loads the library (not XLA handlers).
#include <algorithm>
#include <cstddef>

#include "ffi/ffi_support.h"
#include "qmesh/config.h"
#include "qmesh/cpu_threads.h"
#include "qmesh/export.h"

extern "C" {

// The jaxlib version whose FFI headers this library was compiled against ("0.10.2").
QMESH_API const char* qmesh_jax_built_with_jaxlib() { return QMESH_JAXLIB_VERSION; }

// 1 when the library has CUDA handlers (symbols Qmesh*Cuda), else 0.
QMESH_API int qmesh_jax_has_cuda() { return QMESH_WITH_CUDA; }

// Bytes of the uint8 workspace result that the CUDA GEMM handler takes after its other
// results (XLA allocates it, so that the handler allocates nothing).
QMESH_API size_t qmesh_jax_gemm_workspace_bytes() {
  return qmesh::ffi::gemm_workspace_result_bytes();
}

// Caps the threads of each host op (qmesh::set_cpu_thread_limit); returns 0, or -1 when
// `threads` is negative. Nothing is thrown across this boundary.
QMESH_API int qmesh_jax_set_cpu_thread_limit(int threads) {
  if (threads < 0) return -1;
  qmesh::set_cpu_thread_limit(threads);
  return 0;
}

}  // extern "C"
