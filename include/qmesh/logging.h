// Leveled logging to stderr. The level comes from QMESH_LOG_LEVEL (error, warn, info,
// debug; default warn). Thread-safe: each message is written with one call.
#pragma once

#include <string>

#include "qmesh/error.h"
#include "qmesh/export.h"

namespace qmesh {

enum class LogLevel { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

// The active level, read from QMESH_LOG_LEVEL on first use (an unknown value is an Error).
QMESH_API LogLevel log_level();
// Overrides the level for this process (tests, CLIs with --verbose).
QMESH_API void set_log_level(LogLevel level);
// Writes "qmesh <LEVEL> <file>:<line>: <message>" to stderr if level is enabled.
QMESH_API void log_message(LogLevel level, const char* file, int line, const std::string& message);

}  // namespace qmesh

#define QMESH_LOG(level, ...)                                            \
  do {                                                                   \
    if (::qmesh::LogLevel::level <= ::qmesh::log_level())                \
      ::qmesh::log_message(::qmesh::LogLevel::level, __FILE__, __LINE__, \
                           ::qmesh::detail::concat(__VA_ARGS__));        \
  } while (0)
#define QMESH_LOG_ERROR(...) QMESH_LOG(kError, __VA_ARGS__)
#define QMESH_LOG_WARN(...) QMESH_LOG(kWarn, __VA_ARGS__)
#define QMESH_LOG_INFO(...) QMESH_LOG(kInfo, __VA_ARGS__)
#define QMESH_LOG_DEBUG(...) QMESH_LOG(kDebug, __VA_ARGS__)
