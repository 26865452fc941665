// Scaling-state checkpoint, format version 1 (all integers and floats little-endian):
//   offset 0   char[8]  magic "QMSCALE\0"
//          8   u32      version (1)
//         12   u32      n, number of operands
//         16   u32      L, history length
//         20   u8       amax_compute_algo, u8 fp8_format, u16 zero
//         24   f32      margin
//         28   u8[n]    operand roles
//              f32[L*n] amax history, row-major [L, n]
//              f32[n]   scale
//              f32[n]   scale_inv
//              u32      CRC-32 (IEEE 802.3, as zlib's crc32) of every byte before it
#include "qmesh/scaling/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/logging.h"

namespace qmesh {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the checkpoint format is little-endian; add byte swapping for this target");

constexpr char kMagic[8] = {'Q', 'M', 'S', 'C', 'A', 'L', 'E', '\0'};
constexpr size_t kHeaderBytes = 28;

uint32_t crc32(const uint8_t* data, size_t n) {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) c = table[(c ^ data[i]) & 0xFFu] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

size_t file_bytes(uint64_t n, uint64_t len) { return kHeaderBytes + n + 4 * (len * n + 2 * n) + 4; }

void put_bytes(std::vector<uint8_t>& out, const void* p, size_t n) {
  const size_t at = out.size();
  out.resize(at + n);
  std::memcpy(out.data() + at, p, n);
}

template <class T>
void put(std::vector<uint8_t>& out, const T& v) {
  put_bytes(out, &v, sizeof(T));
}

template <class T>
T get(const std::vector<uint8_t>& in, size_t offset) {
  T v;
  std::memcpy(&v, in.data() + offset, sizeof(T));
  return v;
}

void append_tensor(std::vector<uint8_t>& out, const TensorView& t) {
  const size_t at = out.size();
  out.resize(at + t.nbytes());
  copy_bytes(out.data() + at, Device::host(), t.data, t.device, t.nbytes());
}

void write_all(int fd, const std::vector<uint8_t>& bytes, const std::string& tmp) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t w = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (w < 0 && errno == EINTR) continue;
    QMESH_CHECK(w > 0, "writing scaling checkpoint ", tmp, " failed: ", std::strerror(errno));
    done += static_cast<size_t>(w);
  }
  QMESH_CHECK(::fsync(fd) == 0, "fsync of scaling checkpoint ", tmp,
              " failed: ", std::strerror(errno));
}

}  // namespace

void save_scaling_states(const ScalingStates& states, const std::string& path) {
  const uint32_t n = states.size(), len = states.history_len();
  std::vector<uint8_t> bytes;
  bytes.reserve(file_bytes(n, len));
  put_bytes(bytes, kMagic, sizeof(kMagic));
  put(bytes, kScalingCheckpointVersion);
  put(bytes, n);
  put(bytes, len);
  put(bytes, static_cast<uint8_t>(states.recipe().amax_compute_algo));
  put(bytes, static_cast<uint8_t>(states.recipe().fp8_format));
  put(bytes, uint16_t{0});
  put(bytes, states.recipe().margin);
  for (OperandRole r : states.roles()) put(bytes, static_cast<uint8_t>(r));
  append_tensor(bytes, states.amax_history());
  append_tensor(bytes, states.scale());
  append_tensor(bytes, states.scale_inv());
  put(bytes, crc32(bytes.data(), bytes.size()));

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  QMESH_CHECK(fd >= 0, "cannot create scaling checkpoint ", tmp, ": ", std::strerror(errno),
              "; check that the directory exists and is writable");
  try {
    write_all(fd, bytes, tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  QMESH_CHECK(::close(fd) == 0, "closing scaling checkpoint ", tmp,
              " failed: ", std::strerror(errno));
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

void load_scaling_states(ScalingStates& states, const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  QMESH_CHECK(file.good(), "cannot open scaling checkpoint ", path, ": ", std::strerror(errno));
  const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(file)),
                                   std::istreambuf_iterator<char>());
  QMESH_CHECK(!file.bad(), "reading scaling checkpoint ", path, " failed");
  QMESH_CHECK(bytes.size() >= kHeaderBytes && std::memcmp(bytes.data(), kMagic, 8) == 0, path,
              " is not a qmesh scaling checkpoint (", bytes.size(),
              " bytes, magic \"QMSCALE\" missing)");
  const auto version = get<uint32_t>(bytes, 8);
  QMESH_CHECK(version == kScalingCheckpointVersion, "scaling checkpoint ", path,
              " has format version ", version, " but this build reads version ",
              kScalingCheckpointVersion, "; convert it with the qmesh release that wrote it");
  const auto n = get<uint32_t>(bytes, 12);
  const auto len = get<uint32_t>(bytes, 16);
  const size_t expected = file_bytes(n, len);
  QMESH_CHECK(bytes.size() >= expected, "scaling checkpoint ", path,
              " is truncated: ", bytes.size(), " bytes, its header announces ", expected);
  QMESH_CHECK(bytes.size() == expected, "scaling checkpoint ", path, " has ",
              bytes.size() - expected, " trailing bytes after the ", expected,
              " its header announces");
  const auto stored_crc = get<uint32_t>(bytes, expected - 4);
  const uint32_t crc = crc32(bytes.data(), expected - 4);
  QMESH_CHECK(crc == stored_crc, "scaling checkpoint ", path,
              " is corrupted: checksum mismatch (stored ", stored_crc, ", computed ", crc, ")");
  QMESH_CHECK(n == uint32_t(states.size()) && len == uint32_t(states.history_len()),
              "scaling checkpoint ", path, " holds ", n, " operands x history ", len,
              " but the state has ", states.size(), " operands x history ", states.history_len(),
              "; build the ScalingStates with the saved recipe and operands");
  for (uint32_t i = 0; i < n; ++i) {
    const auto saved = static_cast<OperandRole>(bytes[kHeaderBytes + i]);
    QMESH_CHECK(saved == states.role(int(i)), "scaling checkpoint ", path, ": operand ", i,
                " was saved with role ", int(saved), " but the state has role ",
                int(states.role(int(i))), "; the operands must be registered in the same order");
  }
  const DelayedScaling& r = states.recipe();
  if (get<uint8_t>(bytes, 20) != uint8_t(r.amax_compute_algo) ||
      get<uint8_t>(bytes, 21) != uint8_t(r.fp8_format) || get<float>(bytes, 24) != r.margin)
    QMESH_LOG_WARN("scaling checkpoint ", path,
                   " was written with another margin, amax algorithm or FP8 format than the "
                   "current recipe; its histories and scales are loaded as they are");
  size_t at = kHeaderBytes + n;
  for (const TensorView& t : {states.amax_history(), states.scale(), states.scale_inv()}) {
    copy_bytes(t.data, t.device, bytes.data() + at, Device::host(), t.nbytes());
    at += t.nbytes();
  }
}

}  // namespace qmesh
