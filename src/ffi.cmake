# qmesh_jax_ffi: the XLA FFI handlers that python/qmesh registers with JAX (CPU handlers, and
# CUDA handlers in a CUDA build). Not part of the C++ package: the Python package installs it
# with qmesh's shared libraries beside it (install component "jax", RPATH $ORIGIN).
add_library(qmesh_jax_ffi SHARED
  ${CMAKE_CURRENT_LIST_DIR}/ffi/ffi_support.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ffi/library_info.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ffi/quantize_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ffi/scaling_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ffi/gemm_handlers.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ffi/layer_norm_handlers.cpp)
qmesh_target_defaults(qmesh_jax_ffi)
target_compile_features(qmesh_jax_ffi PRIVATE cxx_std_20)
# jaxlib's c_api.h names struct members like the typedefs of their types, which -Wpedantic
# turns into errors even in a system header.
target_compile_options(qmesh_jax_ffi PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-pedantic>)
# SYSTEM: g++ warns inside jaxlib's ffi.h (-Wattributes, -Wreturn-type) under -Werror.
target_include_directories(qmesh_jax_ffi SYSTEM PRIVATE ${QMESH_JAX_INCLUDE_DIR})
target_include_directories(qmesh_jax_ffi PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_compile_definitions(qmesh_jax_ffi PRIVATE
  QMESH_JAXLIB_VERSION="${QMESH_JAXLIB_VERSION}")
target_link_libraries(qmesh_jax_ffi PRIVATE qmesh)
set_target_properties(qmesh_jax_ffi PROPERTIES BUILD_RPATH_USE_ORIGIN ON)

