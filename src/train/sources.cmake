# src/train: training utilities (training checkpoints, gradient sync, the MSE loss,
# optimizers).
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/grad_sync.cpp
  ${CMAKE_CURRENT_LIST_DIR}/loss.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer.cpp)
