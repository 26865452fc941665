# src/c_api: libqmesh_c, the stable C API (include/qmesh/c_api.h) over qmesh.
target_sources(qmesh_c PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/boundary.cpp
  ${CMAKE_CURRENT_LIST_DIR}/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tensor_view.cpp
  ${CMAKE_CURRENT_LIST_DIR}/train.cpp
  ${CMAKE_CURRENT_LIST_DIR}/world.cpp)
