# src/cpu: libqmesh's host backend (casts, block-scaled casts, GELU, GEMMs over OpenBLAS,
# the thread pool).
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/block_cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu_threads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gelu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_cpu.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_device_scalars.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mxfp8_cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/norm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nvfp4_cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scale_swizzle.cpp)
# GELU, the norms and the NVFP4 casts on the host must give the CUDA backend's bits: no
# contraction into fused multiply-adds in these host twins (cpu/gelu.h).
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cast.cpp
    ${CMAKE_CURRENT_LIST_DIR}/gelu.cpp ${CMAKE_CURRENT_LIST_DIR}/norm.cpp
    ${CMAKE_CURRENT_LIST_DIR}/nvfp4_cast.cpp PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
endif()
if(QMESH_WITH_BLAS)
  target_link_libraries(qmesh PRIVATE BLAS::BLAS)
  # Debian installs OpenBLAS's cblas.h under the multiarch include directory, which is on
  # the default search path; other layouts name it next to the library.
  find_path(QMESH_CBLAS_INCLUDE cblas.h PATH_SUFFIXES openblas)
  if(QMESH_CBLAS_INCLUDE)
    target_include_directories(qmesh SYSTEM PRIVATE ${QMESH_CBLAS_INCLUDE})
  endif()
endif()
