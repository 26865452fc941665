// qmesh's error model: every failure inside the C++ API is a qmesh::Error exception that
// says where it happened, which call failed and what the failing library said, and carries a
// kind. Errors are converted to status codes at every ABI edge (C API, XLA FFI), each kind to
// one code; they never cross extern "C".
#pragma once

#include <exception>
#include <sstream>
#include <string>
#include <utility>

#include "qmesh/export.h"

namespace qmesh {

// What kind of failure an Error is: what the caller can do about it.
enum class ErrorKind {
  kInvalidArgument,  // the input or the call breaks a precondition (QMESH_CHECK): fix the call
  kUnsupported,      // this build or this device lacks the feature ("built without MPI")
  kTimeout,          // a bounded wait ran out: a peer died, froze or never joined
  kRuntime,          // a library qmesh calls failed (CUDA, cuBLASLt, NCCL, MPI, UCX)
};

// "invalid argument", "unsupported", "timeout", "runtime".
QMESH_API const char* error_kind_name(ErrorKind kind);

class QMESH_API Error : public std::exception {
 public:
  // message: what went wrong and what to do about it.
  // call: the text of the failing call or condition ("" if none).
  // library_message: the error string of the library that failed ("" if none).
  Error(ErrorKind kind, std::string message, const char* file, int line, std::string call = {},
        std::string library_message = {});
  // An ErrorKind::kInvalidArgument.
  Error(std::string message, const char* file, int line, std::string call = {},
        std::string library_message = {});

  const char* what() const noexcept override { return what_.c_str(); }
  ErrorKind kind() const noexcept { return kind_; }
  const std::string& message() const noexcept { return message_; }
  const std::string& call() const noexcept { return call_; }
  const std::string& library_message() const noexcept { return library_message_; }
  const char* file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  ErrorKind kind_;
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

// Throws qmesh::Error (ErrorKind::kInvalidArgument) with a message built from the arguments.
#define QMESH_THROW(...) \
  throw ::qmesh::Error(::qmesh::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// The same with a kind (an ErrorKind value): QMESH_THROW_KIND(ErrorKind::kTimeout, ...).
#define QMESH_THROW_KIND(kind, ...) \
  throw ::qmesh::Error((kind), ::qmesh::detail::concat(__VA_ARGS__), __FILE__, __LINE__)

// Checks an invariant or an argument; on failure throws qmesh::Error
// (ErrorKind::kInvalidArgument) naming the condition.
#define QMESH_CHECK(cond, ...) \
  QMESH_DETAIL_CHECK(::qmesh::ErrorKind::kInvalidArgument, cond, #cond, __VA_ARGS__)

// The same with a kind: QMESH_CHECK_KIND(ErrorKind::kUnsupported, have_mpi, "built without MPI").
#define QMESH_CHECK_KIND(kind, cond, ...) QMESH_DETAIL_CHECK((kind), cond, #cond, __VA_ARGS__)

#define QMESH_DETAIL_CHECK(kind, cond, cond_text, ...)                                     \
  do {                                                                                     \
    if (!(cond)) [[unlikely]]                                                              \
      throw ::qmesh::Error(kind, ::qmesh::detail::concat(__VA_ARGS__), __FILE__, __LINE__, \
                           cond_text);                                                     \
  } while (0)
