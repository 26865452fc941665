// Whole-file I/O for checkpoints (internal to qmesh's libraries; exported so that libqmesh's
// scaling checkpoint shares it with libqmesh_core's tensor files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "qmesh/export.h"

namespace qmesh {

// Writes `bytes` to `path` through a temporary file in the same directory that is fsync'ed
// and renamed over `path` (and the directory fsync'ed): a crash leaves either the old file
// or the complete new one, never a half-written file. `what` names the file in errors.
QMESH_API void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes,
                                     const char* what);
// Reads a whole file; Error naming `what` and the system error if it cannot.
QMESH_API std::vector<uint8_t> read_file(const std::string& path, const char* what);
// CRC-32 (IEEE 802.3, zlib's crc32) of a byte range.
QMESH_API uint32_t crc32_of(const uint8_t* data, size_t n);

}  // namespace qmesh
