#include "qmesh/error.h"

#include <cstring>

namespace qmesh {

namespace {
// Only the file name: full build paths make messages long and leak the build machine.
const char* basename_of(const char* path) {
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}
}  // namespace

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidArgument:
      return "invalid argument";
    case ErrorKind::kUnsupported:
      return "unsupported";
    case ErrorKind::kTimeout:
      return "timeout";
    case ErrorKind::kRuntime:
      return "runtime";
  }
  return "unknown";
}

Error::Error(std::string message, const char* file, int line, std::string call,
             std::string library_message)
    : Error(ErrorKind::kInvalidArgument, std::move(message), file, line, std::move(call),
            std::move(library_message)) {}

Error::Error(ErrorKind kind, std::string message, const char* file, int line, std::string call,
             std::string library_message)
    : kind_(kind),
      message_(std::move(message)),
      call_(std::move(call)),
      library_message_(std::move(library_message)),
      file_(basename_of(file)),
      line_(line) {
  what_ = detail::concat("qmesh error at ", file_, ":", line_, ": ", message_);
  if (!call_.empty()) what_ += detail::concat(" [failed: ", call_, "]");
  if (!library_message_.empty()) what_ += detail::concat(" [", library_message_, "]");
}

}  // namespace qmesh
