# comm/algorithms: collective algorithms written against the Communicator interfaces (rings,
# reductions, the rank-ordered reduction).
target_sources(qmesh_comm PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/ordered_reduce.cpp
  ${CMAKE_CURRENT_LIST_DIR}/reduce.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ring.cpp)
