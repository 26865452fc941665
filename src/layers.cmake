# Layers (fp32 activations on the host or a CUDA device; GEMMs through qmesh::gemm), the layer
# ops they run between GEMMs (LayerNorm, bias, GELU backward, add, bf16 cast) and training
# utilities (gradient sync, optimizers, the MSE loss, training checkpoints).
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/layers/dense.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/fp8_stats.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/forward_epilogue.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/fsdp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/fsdp_layer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/gather_buffer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/layer_context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/layer_norm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/layer_norm_mlp.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/operand_cast.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers/stream_ordered_tensor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ops/layer_ops.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/grad_sync.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/loss.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train/optimizer.cpp)
if(QMESH_WITH_CUDA)
  target_sources(qmesh PRIVATE ${CMAKE_CURRENT_LIST_DIR}/cuda/layer_ops.cu
    ${CMAKE_CURRENT_LIST_DIR}/cuda/loss.cu)
endif()
