# src/cuda: libqmesh's CUDA backend (included in a build with CUDA only): every kernel (.cu)
# and every call of the CUDA runtime or cuBLASLt that libqmesh makes.
# CMake 3.25 does not know nvcc's C++20 flag, yet qmesh's cxx_std_20 feature asks for a
# CUDA20 dialect when the target has CUDA sources: name the flag for this directory.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/block_cast.cu
  ${CMAKE_CURRENT_LIST_DIR}/cast.cu
  ${CMAKE_CURRENT_LIST_DIR}/device_arch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device_scalar.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_algo_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_cublaslt.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_device_scalars.cu
  ${CMAKE_CURRENT_LIST_DIR}/layer_ops.cu
  ${CMAKE_CURRENT_LIST_DIR}/loss.cu
  ${CMAKE_CURRENT_LIST_DIR}/mxfp8_cast.cu
  ${CMAKE_CURRENT_LIST_DIR}/norm.cu
  ${CMAKE_CURRENT_LIST_DIR}/nvfp4_cast.cu
  ${CMAKE_CURRENT_LIST_DIR}/ring_add.cu
  ${CMAKE_CURRENT_LIST_DIR}/ring_checks.cu
  ${CMAKE_CURRENT_LIST_DIR}/ring_device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scale_swizzle.cu
  ${CMAKE_CURRENT_LIST_DIR}/scaling.cu
  ${CMAKE_CURRENT_LIST_DIR}/stream_scratch.cpp)
# cuBLASLt and the runtime only: never the driver library (libcuda), so that programs start
# on machines without a driver. One CUDA runtime per process: the shared one that qmesh_core
# links.
target_link_libraries(qmesh PRIVATE CUDA::cublasLt)
set_target_properties(qmesh PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
# The kernels the native Blackwell GEMMs need (the MXFP8 and NVFP4 casts, the scale swizzle,
# the NVFP4 GEMM's device alpha)
# compiled for sm_100a too, in every CUDA build, so that a change that breaks them there is
# seen without a Blackwell GPU; never linked (a build for Blackwell names 100a in
# CMAKE_CUDA_ARCHITECTURES, which makes this check redundant). docs/gpu.md "Blackwell".
if(NOT "100a" IN_LIST CMAKE_CUDA_ARCHITECTURES)
  add_library(qmesh_sm100a_check OBJECT ${CMAKE_CURRENT_LIST_DIR}/gemm_device_scalars.cu
              ${CMAKE_CURRENT_LIST_DIR}/mxfp8_cast.cu ${CMAKE_CURRENT_LIST_DIR}/nvfp4_cast.cu
              ${CMAKE_CURRENT_LIST_DIR}/scale_swizzle.cu)
  set_target_properties(qmesh_sm100a_check PROPERTIES CUDA_ARCHITECTURES 100a)
  target_include_directories(qmesh_sm100a_check PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
  target_link_libraries(qmesh_sm100a_check PRIVATE qmesh_core)
  qmesh_target_defaults(qmesh_sm100a_check)
endif()
