// The C API's boundary: every exported function runs its body through guard(), which turns
// every C++ exception into a qmesh_status and this thread's qmesh_last_error() message, and
// the checks of what C callers pass (handles, pointers, config struct sizes, enums).
#pragma once

#include <cstddef>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <type_traits>
#include <utility>

#include "qmesh/c_api.h"
#include "qmesh/error.h"

namespace qmesh::capi {

// The status of each kind of qmesh::Error: invalid argument -> QMESH_ERROR_INVALID_ARGUMENT,
// unsupported -> QMESH_ERROR_UNSUPPORTED, timeout and runtime -> QMESH_ERROR_FAILED.
qmesh_status status_of(ErrorKind kind) noexcept;

// Records `message` as this thread's last error and returns `status`.
qmesh_status fail(qmesh_status status, std::string message) noexcept;

// Runs body(); returns QMESH_OK, or the status of what it threw, with the message prefixed by
// the C function's name.
template <class Body>
qmesh_status guard(const char* function, Body&& body) noexcept {
  try {
    try {
      std::forward<Body>(body)();
      return QMESH_OK;
    } catch (const Error& e) {
      return fail(status_of(e.kind()), std::string(function) + ": " + e.message());
    } catch (const std::bad_alloc&) {
      return fail(QMESH_ERROR_OUT_OF_MEMORY, std::string(function) + ": out of memory");
    } catch (const std::exception& e) {
      return fail(QMESH_ERROR_INTERNAL, std::string(function) + ": " + e.what());
    }
  } catch (...) {  // also what building a message may throw
    return fail(QMESH_ERROR_INTERNAL, "qmesh: unexpected failure");
  }
}

// Throws Error naming `what` if p is null.
template <class T>
T* require(T* p, const char* what) {
  if (p == nullptr) QMESH_THROW(std::string(what) + " is NULL");
  return p;
}

// The caller's config struct, or `defaults` where an older caller's struct ends: struct_size
// must lie in [min_size, sizeof(T)] (min_size: the size of the struct's first version).
template <class T>
T read_config(const T* config, T defaults, size_t min_size, const char* type) {
  require(config, type);
  if (config->struct_size < min_size || config->struct_size > sizeof(T))
    QMESH_THROW(std::string(type) + ".struct_size is " + std::to_string(config->struct_size) +
                "; set it to sizeof(" + type + ") (" + std::to_string(sizeof(T)) +
                " in this library's header)");
  std::memcpy(static_cast<void*>(&defaults), config, config->struct_size);
  defaults.struct_size = sizeof(T);
  return defaults;
}

// The integer a C caller stored in an enum object, read without an enum-typed load (in C++
// loading a value outside the enumerators is undefined behaviour).
template <class E>
int raw_enum(const E& e) {
  std::underlying_type_t<E> v;
  std::memcpy(&v, &e, sizeof v);
  return static_cast<int>(v);
}

// Throws Error unless first <= value <= last; returns value.
int checked_enum(int value, int first, int last, const char* what);
template <class E>
int checked_enum(const E& value, int first, int last, const char* what) {
  return checked_enum(raw_enum(value), first, last, what);
}

// Throws Error unless n >= 0 and (n == 0 or p is not null).
void require_array(const void* p, int n, const char* what);

}  // namespace qmesh::capi
