# Finds what the XLA FFI handler library needs from JAX: the FFI headers that jaxlib ships
# and the jax/jaxlib versions they belong to (recorded in the library, checked at import).
# Sets QMESH_JAX_FOUND, QMESH_JAX_INCLUDE_DIR, QMESH_JAXLIB_VERSION and QMESH_JAX_PYTHON.
set(QMESH_PYTHON "" CACHE FILEPATH "Python interpreter whose jax provides the XLA FFI headers")
set(QMESH_JAX_FOUND OFF)
set(_qmesh_python "${QMESH_PYTHON}")
if(NOT _qmesh_python AND Python_EXECUTABLE)  # set by scikit-build-core
  set(_qmesh_python "${Python_EXECUTABLE}")
endif()
if(NOT _qmesh_python)
  find_program(_qmesh_python_found NAMES python3 python)
  set(_qmesh_python "${_qmesh_python_found}")
endif()
if(_qmesh_python)
  execute_process(
    COMMAND "${_qmesh_python}" -c
            "import jax.ffi, jaxlib; print(jax.ffi.include_dir()); print(jaxlib.__version__)"
    OUTPUT_VARIABLE _qmesh_jax_out ERROR_QUIET RESULT_VARIABLE _qmesh_jax_rc
    OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(_qmesh_jax_rc EQUAL 0)
    string(REPLACE "\n" ";" _qmesh_jax_out "${_qmesh_jax_out}")
    list(GET _qmesh_jax_out 0 QMESH_JAX_INCLUDE_DIR)
    list(GET _qmesh_jax_out 1 QMESH_JAXLIB_VERSION)
    set(QMESH_JAX_FOUND ON)
    set(QMESH_JAX_PYTHON "${_qmesh_python}")
    message(STATUS "qmesh: JAX FFI headers of jaxlib ${QMESH_JAXLIB_VERSION} from ${_qmesh_python}")
  endif()
endif()
