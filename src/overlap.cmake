# Collective GEMMs: all-gather + GEMM and GEMM + reduce-scatter rings over a Communicator,
# on host tensors or on one CUDA device (compute and transfer streams joined by events).
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/overlap/collective_gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/overlap/operand_gather.cpp
  ${CMAKE_CURRENT_LIST_DIR}/overlap/ring_device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/overlap/ring_exec.cpp)
# The CUDA pieces of the rings (overlap/ring_device.h): their CUDA implementation, or the one
# that refuses CUDA tensors.
if(QMESH_WITH_CUDA)
  target_sources(qmesh PRIVATE ${CMAKE_CURRENT_LIST_DIR}/overlap/ring_device_cuda.cpp
                               ${CMAKE_CURRENT_LIST_DIR}/overlap/ring_add.cu
                               ${CMAKE_CURRENT_LIST_DIR}/overlap/ring_checks.cu)
else()
  target_sources(qmesh PRIVATE ${CMAKE_CURRENT_LIST_DIR}/overlap/ring_device_no_cuda.cpp)
endif()
