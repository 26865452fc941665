// A yes/no answer with the reason for "no": what "can this be done?" queries return
// (GEMM's can_implement), where throwing would be the wrong tool.
#pragma once

#include <string>
#include <utility>

#include "qmesh/export.h"

namespace qmesh {

class QMESH_API Status {
 public:
  // Success.
  Status() = default;
  // Failure; `reason` says what is wrong and what to do about it (must not be empty).
  static Status failure(std::string reason) { return Status(std::move(reason)); }

  bool ok() const { return reason_.empty(); }
  explicit operator bool() const { return ok(); }
  // "" on success.
  const std::string& reason() const { return reason_; }

 private:
  explicit Status(std::string reason)
      : reason_(reason.empty() ? std::string("failure (no reason given)") : std::move(reason)) {}
  std::string reason_;
};

}  // namespace qmesh
