# Layers (host fp32 activations; GEMMs through qmesh::gemm) and training utilities.
target_sources(qmesh PRIVATE
  layers/dense.cpp
  layers/gather_buffer.cpp
  layers/layer_context.cpp
  layers/layer_norm.cpp
  layers/layer_norm_mlp.cpp
  layers/operand_cast.cpp
  train/grad_sync.cpp
  train/optimizer.cpp)
