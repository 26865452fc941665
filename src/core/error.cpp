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

Error::Error(std::string message, const char* file, int line, std::string call,
             std::string library_message)
    : message_(std::move(message)),
      call_(std::move(call)),
      library_message_(std::move(library_message)),
      file_(basename_of(file)),
      line_(line) {
  what_ = detail::concat("qmesh error at ", file_, ":", line_, ": ", message_);
  if (!call_.empty()) what_ += detail::concat(" [failed: ", call_, "]");
  if (!library_message_.empty()) what_ += detail::concat(" [", library_message_, "]");
}

}  // namespace qmesh
