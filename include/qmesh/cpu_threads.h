// How many threads one host op of the CPU backend may use.
#pragma once

#include "qmesh/export.h"

namespace qmesh {

// Caps the threads of every host op (and of OpenBLAS's GEMMs) at `threads` for the whole
// process; 0 removes the cap. Without a cap an op uses QMESH_CPU_THREADS threads (0: one per
// hardware thread). A program that runs several host ops at once on threads of its own (JAX
// with several CPU devices executes each device on its own thread) sets the cap to
// cores / concurrent ops so that together they do not oversubscribe the cores. Error if
// `threads` is negative. Thread-safe.
QMESH_API void set_cpu_thread_limit(int threads);

// The cap set by set_cpu_thread_limit (0: none).
QMESH_API int cpu_thread_limit();

}  // namespace qmesh
