# comm/local: the local backend (the ranks of a world are threads of one process).
target_sources(qmesh_comm PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/local.cpp
  ${CMAKE_CURRENT_LIST_DIR}/local_world.cpp)
