# src/ffi: libqmesh_jax_ffi, the XLA FFI handlers that python/qmesh registers with JAX.
target_sources(qmesh_jax_ffi PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/block_quantize_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/collective_gemm_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ffi_support.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grouped_scaled_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jax_comm_registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_norm_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/library_info.cpp
  ${CMAKE_CURRENT_LIST_DIR}/microscaled_gemm_handler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mxfp8_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/nvfp4_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/quantize_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring_place.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scaling_handlers.cpp)
