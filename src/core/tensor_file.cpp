#include "qmesh/tensor_file.h"

#include <algorithm>
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

// One tensor of a file: its header and where its data starts in the file's bytes.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  const uint8_t* data;
};

// Checks the file's bytes completely (magic, version, checksum, every header, every tensor's
// size, no trailing bytes) and lists its tensors in file order.
std::vector<Entry> parse(const std::vector<uint8_t>& bytes, const std::string& path) {
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
  std::vector<Entry> entries;
  for (uint32_t i = 0; i < count; ++i) {
    const auto name_len = in.get<uint32_t>();
    std::string name(reinterpret_cast<const char*>(in.take(name_len)), name_len);
    const auto dtype = static_cast<DType>(in.get<uint8_t>());
    const size_t element = dtype_size(dtype);  // an Error for an unknown dtype
    std::vector<int64_t> dims(in.get<uint8_t>());
    for (auto& d : dims) d = in.get<int64_t>();
    Shape shape(std::move(dims));  // an Error for dimensions < 1 or too many elements
    QMESH_CHECK(uint64_t(shape.numel()) <= (body - in.offset()) / element, "tensor file ", path,
                " is truncated or corrupted ('", name, "' ", shape.str(), " runs past the end)");
    const uint8_t* data = in.take(size_t(shape.numel()) * element);
    entries.push_back({std::move(name), dtype, std::move(shape), data});
  }
  QMESH_CHECK(in.offset() == body, "tensor file ", path, " has ", body - in.offset(),
              " unexpected trailing bytes");
  return entries;
}

// Copies each of `tensors` from the entry of its name, after checking that every one of them
// has an entry of its dtype and shape (so on an Error nothing is written).
void assign(const std::vector<Entry>& entries, const std::vector<NamedTensor>& tensors,
            const std::string& path) {
  std::vector<const uint8_t*> data;
  for (const NamedTensor& t : tensors) {
    const auto e = std::find_if(entries.begin(), entries.end(),
                                [&](const Entry& x) { return x.name == t.name; });
    QMESH_CHECK(e != entries.end(), "tensor file ", path, " lacks '", t.name, "'");
    QMESH_CHECK(t.tensor.dtype == e->dtype && t.tensor.shape == e->shape, "tensor '", t.name,
                "' in ", path, " does not match the model's ", dtype_name(t.tensor.dtype), " ",
                t.tensor.shape.str(), " (a checkpoint of a different configuration?)");
    data.push_back(e->data);
  }
  for (size_t i = 0; i < tensors.size(); ++i)
    copy_bytes(tensors[i].tensor.data, tensors[i].tensor.device, data[i], Device::host(),
               tensors[i].tensor.nbytes());
}

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

std::map<std::string, Tensor> read_tensors(const std::string& path) {
  const std::vector<uint8_t> bytes = read_file(path, "tensor file");
  std::map<std::string, Tensor> out;
  for (const Entry& e : parse(bytes, path)) {
    Tensor t(e.dtype, e.shape);
    std::memcpy(t.data(), e.data, t.nbytes());
    out.emplace(e.name, std::move(t));
  }
  return out;
}

void load_tensors(const std::string& path, const std::vector<NamedTensor>& tensors) {
  const std::vector<uint8_t> bytes = read_file(path, "tensor file");
  const std::vector<Entry> entries = parse(bytes, path);
  QMESH_CHECK(entries.size() == tensors.size(), "tensor file ", path, " holds ", entries.size(),
              " tensors, expected ", tensors.size(), " (a checkpoint of a different model?)");
  for (const Entry& e : entries)
    QMESH_CHECK(std::any_of(tensors.begin(), tensors.end(),
                            [&](const NamedTensor& t) { return t.name == e.name; }),
                "tensor file ", path, " holds '", e.name, "', which this model does not have");
  assign(entries, tensors, path);
}

void copy_tensors(const std::map<std::string, Tensor>& file,
                  const std::vector<NamedTensor>& tensors, const std::string& path) {
  std::vector<Entry> entries;
  for (const auto& [name, t] : file)
    entries.push_back({name, t.dtype(), t.shape(), static_cast<const uint8_t*>(t.data())});
  assign(entries, tensors, path);
}

}  // namespace qmesh
