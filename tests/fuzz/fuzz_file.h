// Helpers of the file-reader fuzz targets: the input becomes a file with a valid CRC-32
// appended (both formats end with zlib's crc32 of every byte before it), so that mutations
// reach the parser instead of stopping at the checksum.
#pragma once

#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace qmesh::fuzz {

// Writes data + crc32(data) to a file of this process and returns its path.
inline std::string file_with_crc(const uint8_t* data, size_t size) {
  const std::string path = "/tmp/qmesh-fuzz-" + std::to_string(getpid()) + ".bin";
  const uint32_t crc = static_cast<uint32_t>(crc32(0L, data, static_cast<uInt>(size)));
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) std::abort();
  std::fwrite(data, 1, size, f);
  std::fwrite(&crc, 1, sizeof crc, f);
  std::fclose(f);
  return path;
}

}  // namespace qmesh::fuzz
