# src/layers: the layers (Dense, LayerNorm, LayerNormMLP; fp32 activations on the host or a
# CUDA device), their context, FSDP and FP8 statistics.
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/dense.cpp
  ${CMAKE_CURRENT_LIST_DIR}/forward_epilogue.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fp8_stats.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fsdp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fsdp_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gather_buffer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_norm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layer_norm_mlp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/operand_cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stream_ordered_tensor.cpp)
