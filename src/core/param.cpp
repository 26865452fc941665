#include "qmesh/param.h"

#include <cerrno>
#include <cstdlib>

#include "qmesh/error.h"

namespace qmesh {

namespace {
// Returns the variable's value, or nullptr when unset or empty.
const char* lookup(const char* name, std::string& full_name) {
  full_name = std::string("QMESH_") + name;
  const char* value = std::getenv(full_name.c_str());
  return (value && *value) ? value : nullptr;
}
}  // namespace

int64_t param_int(const char* name, int64_t fallback) {
  std::string full;
  const char* value = lookup(name, full);
  if (!value) return fallback;
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(value, &end, 10);
  QMESH_CHECK(errno == 0 && end && *end == '\0', full, "='", value,
              "' is not an integer; unset it to use the default ", fallback);
  return parsed;
}

double param_double(const char* name, double fallback) {
  std::string full;
  const char* value = lookup(name, full);
  if (!value) return fallback;
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(value, &end);
  QMESH_CHECK(errno == 0 && end && *end == '\0', full, "='", value,
              "' is not a number; unset it to use the default ", fallback);
  return parsed;
}

std::string param_string(const char* name, const std::string& fallback) {
  std::string full;
  const char* value = lookup(name, full);
  return value ? std::string(value) : fallback;
}

}  // namespace qmesh
