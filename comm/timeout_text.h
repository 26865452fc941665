// The opening of every communication timeout error, worded alike on every backend so that
// users (and scripts) recognise it: "<what> timed out after <seconds> s
// (QMESH_COMM_TIMEOUT_S)". Each backend adds what the timeout means for it.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "qmesh/export.h"

namespace qmesh::comm_detail {

QMESH_API std::string timeout_text(std::string_view what, std::chrono::milliseconds limit);

}  // namespace qmesh::comm_detail
