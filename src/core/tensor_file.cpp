#include "qmesh/tensor_file.h"

#include <bit>
#include <cstring>
#include <map>

#include "core/atomic_file.h"
#include "qmesh/copy.h"
#include "qmesh/error.h"

namespace qmesh {

namespace {

static_assert(std::endian::native == std::endian::little,
              "the tensor file format is little-endian; add byte swapping for this target");

constexpr char kMagic[8] = {'Q', 'M', 'T', 'E', 'N', 'S', 'O', 'R'};

template <class T>
void put(std::vector<uint8_t>& out, const T& v) {
  const size_t at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

// A bounds-checked reader over the file bytes: running past the end is a truncated file.
class Reader {
 public:
  Reader(const std::vector<uint8_t>& bytes, size_t end, const std::string& path)
      : bytes_(bytes), end_(end), path_(path) {}
  const uint8_t* take(size_t n) {
    QMESH_CHECK(n <= end_ - at_, "tensor file ", path_, " is truncated or corrupted (needs ", n,
                " more bytes at offset ", at_, ")");
    const uint8_t* p = bytes_.data() + at_;
    at_ += n;
    return p;
  }
  template <class T>
  T get() {
    T v;
    std::memcpy(&v, take(sizeof(T)), sizeof(T));
    return v;
  }
  size_t offset() const { return at_; }

 private:
  const std::vector<uint8_t>& bytes_;
  size_t end_, at_ = 0;
  const std::string& path_;
};

}  // namespace

void save_tensors(const std::string& path, const std::vector<NamedTensor>& tensors) {
  std::vector<uint8_t> bytes(kMagic, kMagic + sizeof(kMagic));
  put(bytes, kTensorFileVersion);
  put(bytes, static_cast<uint32_t>(tensors.size()));
  std::map<std::string, int> seen;
  for (const NamedTensor& t : tensors) {
    QMESH_CHECK(seen[t.name]++ == 0, "tensor name '", t.name, "' appears twice in ", path);
    check_not_empty(t.tensor, t.name);
    put(bytes, static_cast<uint32_t>(t.name.size()));
    bytes.insert(bytes.end(), t.name.begin(), t.name.end());
    put(bytes, static_cast<uint8_t>(t.tensor.dtype));
    put(bytes, static_cast<uint8_t>(t.tensor.shape.rank()));
    for (int64_t d : t.tensor.shape.dims()) put(bytes, d);
    const size_t at = bytes.size();
    bytes.resize(at + t.tensor.nbytes());
    copy_bytes(bytes.data() + at, Device::host(), t.tensor.data, t.tensor.device,
               t.tensor.nbytes());
  }
  put(bytes, crc32_of(bytes.data(), bytes.size()));
  write_file_atomically(path, bytes, "tensor file");
}

void load_tensors(const std::string& path, const std::vector<NamedTensor>& tensors) {
  const std::vector<uint8_t> bytes = read_file(path, "tensor file");
  QMESH_CHECK(
      bytes.size() >= sizeof(kMagic) + 12 && std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) == 0,
      path, " is not a qmesh tensor file (", bytes.size(), " bytes, magic missing)");
  const size_t body = bytes.size() - 4;
  uint32_t stored_crc;
  std::memcpy(&stored_crc, bytes.data() + body, 4);
  Reader in(bytes, body, path);
  in.take(sizeof(kMagic));
  const auto version = in.get<uint32_t>();
  QMESH_CHECK(version == kTensorFileVersion, "tensor file ", path, " has format version ", version,
              "; this build reads version ", kTensorFileVersion);
  QMESH_CHECK(crc32_of(bytes.data(), body) == stored_crc, "tensor file ", path,
              " is corrupted (checksum mismatch)");
  const auto count = in.get<uint32_t>();
  QMESH_CHECK(count == tensors.size(), "tensor file ", path, " holds ", count,
              " tensors, expected ", tensors.size(), " (a checkpoint of a different model?)");
  // Validate everything first, remembering where each tensor's data is.
  std::map<std::string, const uint8_t*> data_of;
  for (uint32_t i = 0; i < count; ++i) {
    const auto name_len = in.get<uint32_t>();
    const std::string name(reinterpret_cast<const char*>(in.take(name_len)), name_len);
    const auto dtype = static_cast<DType>(in.get<uint8_t>());
    const int rank = in.get<uint8_t>();
    std::vector<int64_t> dims(static_cast<size_t>(rank));
    for (auto& d : dims) d = in.get<int64_t>();
    const NamedTensor* dst = nullptr;
    for (const NamedTensor& t : tensors)
      if (t.name == name) dst = &t;
    QMESH_CHECK(dst != nullptr, "tensor file ", path, " holds '", name,
                "', which this model does not have");
    QMESH_CHECK(dst->tensor.dtype == dtype && dst->tensor.shape.dims() == dims, "tensor '", name,
                "' in ", path, " does not match the model's ", dtype_name(dst->tensor.dtype), " ",
                dst->tensor.shape.str(), " (a checkpoint of a different configuration?)");
    data_of[name] = in.take(dst->tensor.nbytes());
  }
  QMESH_CHECK(in.offset() == body, "tensor file ", path, " has ", body - in.offset(),
              " unexpected trailing bytes");
  for (const NamedTensor& t : tensors) {
    QMESH_CHECK(data_of.count(t.name), "tensor file ", path, " lacks '", t.name, "'");
  }
  for (const NamedTensor& t : tensors)
    copy_bytes(t.tensor.data, t.tensor.device, data_of[t.name], Device::host(), t.tensor.nbytes());
}

}  // namespace qmesh
