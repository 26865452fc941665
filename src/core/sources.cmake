# src/core: libqmesh_core's sources (core types, host numerics, errors, logging, tunables,
# tensor files); core's CUDA runtime calls (core/cuda_runtime.h) in a build with CUDA.
target_sources(qmesh_core PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/atomic_file.cpp
  ${CMAKE_CURRENT_LIST_DIR}/block_quantized_tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/buffer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/copy.cpp
  ${CMAKE_CURRENT_LIST_DIR}/device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dtype.cpp
  ${CMAKE_CURRENT_LIST_DIR}/error.cpp
  ${CMAKE_CURRENT_LIST_DIR}/float16.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fp8.cpp
  ${CMAKE_CURRENT_LIST_DIR}/logging.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mxfp8_tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nvfp4_tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/owned_stream.cpp
  ${CMAKE_CURRENT_LIST_DIR}/param.cpp
  ${CMAKE_CURRENT_LIST_DIR}/quantized_tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/random.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shape.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stream_cleanup.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor_file.cpp)
if(QMESH_WITH_CUDA)
  target_sources(qmesh_core PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda_runtime.cpp)
endif()
