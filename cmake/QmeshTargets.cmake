# Shared settings for every qmesh target: warnings, sanitizers, include paths.

# qmesh_target_defaults(<target>): warnings (as errors with QMESH_WERROR) for C++ and CUDA,
# and AddressSanitizer + UndefinedBehaviorSanitizer instrumentation with QMESH_SANITIZE,
# ThreadSanitizer instrumentation with QMESH_TSAN, libFuzzer coverage with QMESH_FUZZ.
function(qmesh_target_defaults target)
  if(QMESH_SANITIZE)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-sanitize-recover=undefined
                                -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(QMESH_FUZZ)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined
                                -fno-sanitize-recover=undefined -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
  if(QMESH_TSAN)
    target_compile_options(${target} PRIVATE
      $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
    target_link_options(${target} PRIVATE -fsanitize=thread)
  endif()
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor>
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<BOOL:${QMESH_WERROR}>>:-Werror>
    $<$<COMPILE_LANGUAGE:CUDA>:-std=c++20 -Xcompiler=-Wall,-Wextra>
    $<$<AND:$<COMPILE_LANGUAGE:CUDA>,$<BOOL:${QMESH_WERROR}>>:-Werror=all-warnings>)
endfunction()

# qmesh_export_only(<target> <version script>): a shared library exports only the symbols
# the linker version script names (cmake/qmesh.map: the C++ namespace; cmake/qmesh_c.map:
# the C API).
function(qmesh_export_only target script)
  if(BUILD_SHARED_LIBS)
    target_link_options(${target} PRIVATE -Wl,--version-script=${script})
    set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${script})
  endif()
endfunction()

# qmesh_add_library(<name> ALIAS <alias> SOURCES ... ): a library with the project defaults,
# public headers from include/ and the generated config.h.
function(qmesh_add_library name)
  cmake_parse_arguments(ARG "" "ALIAS" "SOURCES" ${ARGN})
  add_library(${name} ${ARG_SOURCES})
  add_library(qmesh::${ARG_ALIAS} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${ARG_ALIAS}
                                           VERSION ${PROJECT_VERSION}
                                           SOVERSION ${PROJECT_VERSION_MAJOR})
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/include>
    $<BUILD_INTERFACE:${PROJECT_BINARY_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${name} PUBLIC cxx_std_20)
  qmesh_target_defaults(${name})
  qmesh_export_only(${name} ${PROJECT_SOURCE_DIR}/cmake/qmesh.map)
  set_property(GLOBAL APPEND PROPERTY QMESH_EXPORTED_TARGETS ${name})
endfunction()
