# src/scaling: FP8 recipes, the scaling states and their fused update, the global amax
# reduction and the scaling-state checkpoint.
target_sources(qmesh PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/amax_reducer.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/current_scaling.cpp
  ${CMAKE_CURRENT_LIST_DIR}/recipe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/scaling_states.cpp)
