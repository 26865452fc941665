#include "qmesh/logging.h"

#include <atomic>
#include <cstdio>
#include <string_view>

#include "qmesh/param.h"

namespace qmesh {

namespace {

LogLevel parse_level(const std::string& text) {
  if (text == "error") return LogLevel::kError;
  if (text == "warn") return LogLevel::kWarn;
  if (text == "info") return LogLevel::kInfo;
  if (text == "debug") return LogLevel::kDebug;
  QMESH_THROW("QMESH_LOG_LEVEL='", text, "' is not one of error, warn, info, debug");
}

constexpr std::string_view kLevelNames[] = {"ERROR", "WARN", "INFO", "DEBUG"};
constexpr int kUnset = -1;
std::atomic<int> g_level{kUnset};

}  // namespace

LogLevel log_level() {
  int level = g_level.load(std::memory_order_relaxed);
  if (level == kUnset) {
    level = static_cast<int>(parse_level(param_string("LOG_LEVEL", "warn")));
    g_level.store(level, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(level);
}

void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level)); }

void log_message(LogLevel level, const char* file, int line, const std::string& message) {
  std::string_view path(file);
  const size_t slash = path.rfind('/');
  if (slash != std::string_view::npos) path.remove_prefix(slash + 1);
  const std::string text = detail::concat("qmesh ", kLevelNames[static_cast<int>(level)], " ", path,
                                          ":", line, ": ", message, "\n");
  std::fwrite(text.data(), 1, text.size(), stderr);  // one write: lines never interleave
}

}  // namespace qmesh
