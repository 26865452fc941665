# qmesh::c_api (libqmesh_c): the stable C API (include/qmesh/c_api.h) over qmesh and the
# transports this build has. Its link interface names no C++ library, so C programs link it
# alone (pkg-config module qmesh, or find_package(qmesh) and qmesh::c_api).
add_library(qmesh_c
  ${CMAKE_CURRENT_LIST_DIR}/c_api/boundary.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c_api/checkpoint.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c_api/context.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c_api/gemm.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c_api/layers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c_api/tensor_view.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c_api/train.cpp
  ${CMAKE_CURRENT_LIST_DIR}/c_api/world.cpp)
add_library(qmesh::c_api ALIAS qmesh_c)
set_target_properties(qmesh_c PROPERTIES EXPORT_NAME c_api
                                         VERSION ${PROJECT_VERSION}
                                         SOVERSION ${PROJECT_VERSION_MAJOR})
target_include_directories(qmesh_c PUBLIC
  $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
  $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
target_compile_features(qmesh_c PRIVATE cxx_std_20)
target_link_libraries(qmesh_c PRIVATE qmesh
  $<$<BOOL:${QMESH_WITH_MPI}>:qmesh_comm_mpi>
  $<$<BOOL:${QMESH_WITH_UCX}>:qmesh_comm_ucx>)
qmesh_target_defaults(qmesh_c)
qmesh_export_only(qmesh_c ${PROJECT_SOURCE_DIR}/cmake/qmesh_c.map)
set_property(GLOBAL APPEND PROPERTY QMESH_EXPORTED_TARGETS qmesh_c)
