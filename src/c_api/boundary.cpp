// The boundary helpers, the thread's last error and the library's version.
#include "boundary.h"

#include "qmesh/config.h"
#include "qmesh/version.h"

static_assert(QMESH_C_API_VERSION_MAJOR == QMESH_VERSION_MAJOR &&
                  QMESH_C_API_VERSION_MINOR == QMESH_VERSION_MINOR &&
                  QMESH_C_API_VERSION_PATCH == QMESH_VERSION_PATCH,
              "include/qmesh/c_api.h's version must follow the project version (CMakeLists.txt)");

namespace qmesh::capi {
namespace {
thread_local std::string last_error;
}  // namespace

qmesh_status fail(qmesh_status status, std::string message) noexcept {
  last_error = std::move(message);  // a move cannot throw
  return status;
}

qmesh_status status_of(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return QMESH_ERROR_INVALID_ARGUMENT;
    case ErrorKind::kUnsupported:
      return QMESH_ERROR_UNSUPPORTED;
    case ErrorKind::kTimeout:
    case ErrorKind::kRuntime:
      return QMESH_ERROR_FAILED;
  }
  return QMESH_ERROR_INTERNAL;
}

int checked_enum(int value, int first, int last, const char* what) {
  if (value < first || value > last)
    QMESH_THROW(std::string(what) + " is " + std::to_string(value) + "; expected " +
                std::to_string(first) + " to " + std::to_string(last));
  return value;
}

void require_array(const void* p, int n, const char* what) {
  if (n < 0) QMESH_THROW(std::string("the count of ") + what + " is negative");
  if (n > 0 && p == nullptr) QMESH_THROW(std::string(what) + " is NULL");
}

}  // namespace qmesh::capi

extern "C" {

const char* qmesh_last_error(void) { return qmesh::capi::last_error.c_str(); }

const char* qmesh_status_name(qmesh_status status) {
  switch (qmesh::capi::raw_enum(status)) {
    case QMESH_OK:
      return "OK";
    case QMESH_ERROR_INVALID_ARGUMENT:
      return "invalid argument";
    case QMESH_ERROR_FAILED:
      return "failed";
    case QMESH_ERROR_UNSUPPORTED:
      return "unsupported";
    case QMESH_ERROR_OUT_OF_MEMORY:
      return "out of memory";
    case QMESH_ERROR_INTERNAL:
      return "internal error";
  }
  return "unknown status";
}

int qmesh_version(void) { return QMESH_C_API_VERSION; }

const char* qmesh_build_info(void) {
  static const std::string info = [] {
    try {
      return qmesh::build_info();
    } catch (...) {
      return std::string("qmesh ") + QMESH_VERSION_STRING;
    }
  }();
  return info.c_str();
}

}  // extern "C"
