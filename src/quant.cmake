# FP8 quantization and scaling: ops (amax, quantize, cast_transpose, dbias_quantize, grouped
# quantize, dequantize, the block-scaled casts), recipes, scaling state with its fused
# update, the global amax reduction and the scaling-state checkpoint.
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/cpu/block_cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu/cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cpu/cpu_threads.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/block_quantize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/cast_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scaling/amax_reducer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scaling/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scaling/current_scaling.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scaling/recipe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scaling/scaling_states.cpp)
# GELU on the host (the GELU-fused casts, the gelu/dgelu layer ops) must give the CUDA
# backend's bits: no contraction into fused multiply-adds in these host twins (cpu/gelu.h).
if(CMAKE_CXX_COMPILER_ID MATCHES "GNU|Clang")
  set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/cpu/cast.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cpu/gelu.cpp PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
endif()
if(QMESH_WITH_CUDA)
  # CMake 3.25 does not know nvcc's C++20 flag, yet qmesh's cxx_std_20 feature asks for a
  # CUDA20 dialect when the target has CUDA sources: name the flag for this directory.
  set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
  set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
  target_sources(qmesh PRIVATE
    ${CMAKE_CURRENT_LIST_DIR}/cuda/block_cast.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/cast.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/device_scalar.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cuda/stream_scratch.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cuda/scaling.cu)
  # One CUDA runtime per process: the shared one that qmesh_core links.
  set_target_properties(qmesh PROPERTIES CUDA_RUNTIME_LIBRARY Shared)
endif()
