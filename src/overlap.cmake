# Collective GEMMs: all-gather + GEMM and GEMM + reduce-scatter rings over a Communicator.
target_sources(qmesh PRIVATE overlap/collective_gemm.cpp)
