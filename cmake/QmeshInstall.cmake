# Installs the libraries, public headers and the qmesh CMake package:
#   find_package(qmesh) ; target_link_libraries(app PRIVATE qmesh::qmesh)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(_qmesh_targets GLOBAL PROPERTY QMESH_EXPORTED_TARGETS)
install(TARGETS ${_qmesh_targets} EXPORT qmeshTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY include/qmesh DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_BINARY_DIR}/include/qmesh/config.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/qmesh)
install(EXPORT qmeshTargets NAMESPACE qmesh::
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qmesh)
configure_package_config_file(cmake/qmeshConfig.cmake.in
  ${PROJECT_BINARY_DIR}/qmeshConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qmesh)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/qmeshConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/qmeshConfig.cmake
              ${PROJECT_BINARY_DIR}/qmeshConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/qmesh)

# The Python package's files (python/pyproject.toml installs only this component): the JAX
# handler library and the qmesh libraries it loads, side by side (RPATH $ORIGIN).
if(QMESH_WITH_JAX)
  install(TARGETS qmesh_jax_ffi qmesh qmesh_core qmesh_comm
          LIBRARY DESTINATION qmesh/lib COMPONENT jax EXCLUDE_FROM_ALL)
  foreach(backend IN ITEMS ucx nccl)
    if(TARGET qmesh_comm_${backend})
      install(TARGETS qmesh_comm_${backend}
              LIBRARY DESTINATION qmesh/lib COMPONENT jax EXCLUDE_FROM_ALL)
    endif()
  endforeach()
endif()

# pkg-config for C programs (the C API): <libdir>/pkgconfig/qmesh.pc.
file(RELATIVE_PATH QMESH_PC_TO_PREFIX "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
string(REGEX REPLACE "/$" "" QMESH_PC_TO_PREFIX "${QMESH_PC_TO_PREFIX}")
configure_file(cmake/qmesh.pc.in ${PROJECT_BINARY_DIR}/qmesh.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/qmesh.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
