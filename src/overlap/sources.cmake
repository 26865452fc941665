# src/overlap: collective GEMMs (all-gather + GEMM and GEMM + reduce-scatter rings over a
# Communicator) and bulk overlap. Their CUDA pieces (ring_device.h) are in src/cuda; a build
# without CUDA compiles ring_device_no_cuda.cpp instead, which refuses CUDA tensors.
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/collective_gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/operand_gather.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_exec.cpp)
if(NOT QMESH_WITH_CUDA)
  target_sources(qmesh PRIVATE ${CMAKE_CURRENT_LIST_DIR}/ring_device_no_cuda.cpp)
endif()
