# src/ops: libqmesh's public ops (casts and quantization, GEMM, the layer ops), each
# dispatching to the host (src/cpu) or CUDA (src/cuda) backend.
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/block_quantize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/cast_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_algo_key.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_canonical.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_device_scalars.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_emulation.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_native_microscaled.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grouped_scaled_quantize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/microscaled_gemm_path.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mxfp8_quantize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/norm_forward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nvfp4_quantize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scale_swizzle.cpp)
