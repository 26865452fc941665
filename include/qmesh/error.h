// qmesh's error model: every failure inside the C++ API is a qmesh::Error exception that
// says where it happened, which call failed and what the failing library said. Errors are
// converted to status codes at every ABI edge (C API, XLA FFI); they never cross extern "C".
#pragma once

#include <exception>
#include <sstream>
#include <string>
#include <utility>

#include "qmesh/export.h"

namespace qmesh {

class QMESH_API Error : public std::exception {
 public:
  // message: what went wrong and what to do about it.
  // call: the text of the failing call or condition ("" if none).
  // library_message: the error string of the library that failed ("" if none).
  Error(std::string message, const char* file, int line, std::string call = {},
        std::string library_message = {});

  const char* what() const noexcept override { return what_.c_str(); }
  const std::string& message() const noexcept { return message_; }
  const std::string& call() const noexcept { return call_; }
  const std::string& library_message() const noexcept { return library_message_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  std::string message_;
  std::string call_;
  std::string library_message_;
  const char* file_;
  int line_;
  std::string what_;
};

namespace detail {
// Streams all arguments into one string: concat("size ", 3, " != ", 4).
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace qmesh

// Throws qmesh::Error with a message built from the remaining arguments.
#define QMESH_THROW(...) \
  throw ::qmesh::Error(::qmesh::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Checks an invariant or an argument; on failure throws qmesh::Error naming the condition.
#define QMESH_CHECK(cond, ...)                                                               \
  do {                                                                                       \
    if (!(cond)) [[unlikely]]                                                                \
      throw ::qmesh::Error(::qmesh::detail::concat(__VA_ARGS__), __FILE__, __LINE__, #cond); \
  } while (0)
