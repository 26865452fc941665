// Environment tunables. Every QMESH_* environment variable is read through these accessors
// (and nowhere else), and every one is listed in docs/params.md. A value that does not
// parse is an Error naming the variable, never a silent fallback to the default.
#pragma once

#include <cstdint>
#include <string>

#include "qmesh/export.h"

namespace qmesh {

// Reads QMESH_<name> as an integer; `fallback` when unset or empty.
QMESH_API int64_t param_int(const char* name, int64_t fallback);
// Reads QMESH_<name> as a floating-point number; `fallback` when unset or empty.
QMESH_API double param_double(const char* name, double fallback);
// Reads QMESH_<name> as a string; `fallback` when unset.
QMESH_API std::string param_string(const char* name, const std::string& fallback);

}  // namespace qmesh

// QMESH_PARAM(func, "NAME", default) defines `func()` returning QMESH_NAME as an int64_t.
// The variable is read on each call, so tests may change it with setenv.
#define QMESH_PARAM(func, name, fallback) \
  inline int64_t func() { return ::qmesh::param_int(name, fallback); }
