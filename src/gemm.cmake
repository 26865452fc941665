# Quantized GEMM: the public op, the host backend (OpenBLAS) and the CUDA backend (cuBLASLt).
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/ops/gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/gemm_algo_key.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/gemm_canonical.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu/gelu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu/gemm_cpu.cpp)
if(QMESH_WITH_BLAS)
  target_link_libraries(qmesh PRIVATE BLAS::BLAS)
  # Debian installs OpenBLAS's cblas.h under the multiarch include directory, which is on
  # the default search path; other layouts name it next to the library.
  find_path(QMESH_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas)
  if(QMESH_CBLAS_INCLUDE)
    target_include_directories(qmesh SYSTEM PRIVATE ${QMESH_CBLAS_INCLUDE})
  endif()
endif()
if(QMESH_WITH_CUDA)
  target_sources(qmesh PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cuda/gemm_algo_cache.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cuda/gemm_cublaslt.cpp)
  # cuBLASLt and the runtime only: never the driver library (libcuda), so that programs
  # start on machines without a driver.
  target_link_libraries(qmesh PRIVATE CUDA::cublasLt)
endif()
