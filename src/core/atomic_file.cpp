#include "core/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "qmesh/config.h"
#include "qmesh/error.h"
#if QMESH_WITH_ZLIB
#include <zlib.h>
#endif

namespace qmesh {

namespace {

void write_all(int fd, const std::vector<uint8_t>& bytes, const std::string& tmp,
               const char* what) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    QMESH_CHECK(w > 0, "writing ", what, " ", tmp, " failed: ", std::strerror(errno));
    done += static_cast<size_t>(w);
  }
  QMESH_CHECK(::fsync(fd) == 0, "fsync of ", what, " ", tmp, " failed: ", std::strerror(errno));
}

}  // namespace

void write_file_atomically(const std::string& path, const std::vector<uint8_t>& bytes,
                           const char* what) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  QMESH_CHECK(fd >= 0, "cannot create ", what, " ", tmp, ": ", std::strerror(errno),
              "; check that the directory exists and is writable");
  try {
    write_all(fd, bytes, tmp, what);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  QMESH_CHECK(::close(fd) == 0, "closing ", what, " ", tmp, " failed: ", std::strerror(errno));
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    QMESH_THROW("cannot rename ", tmp, " to ", path, ": ", std::strerror(err));
  }
  // Make the rename itself durable.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::vector<uint8_t> read_file(const std::string& path, const char* what) {
  std::ifstream file(path, std::ios::binary);
  QMESH_CHECK(file.good(), "cannot open ", what, " ", path, ": ", std::strerror(errno));
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                             std::istreambuf_iterator<char>());
  QMESH_CHECK(!file.bad(), "reading ", what, " ", path, " failed");
  return bytes;
}

uint32_t crc32_of(const uint8_t* data, size_t n) {
#if !QMESH_WITH_ZLIB
  (void)data;
  (void)n;
  QMESH_THROW_KIND(ErrorKind::kUnsupported,
                   "qmesh was built without zlib, which checkpoints use for their checksum; "
                   "install zlib1g-dev and rebuild");
#else
  uLong crc = ::crc32(0L, Z_NULL, 0);
  // zlib takes the length as uInt: feed large buffers in pieces.
  while (n > 0) {
    const uInt chunk = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = ::crc32(crc, data, chunk);
    data += chunk;
    n -= chunk;
  }
  return static_cast<uint32_t>(crc);
#endif
}

}  // namespace qmesh
