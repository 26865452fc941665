#include "qmesh/comm/bootstrap.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "qmesh/comm/communicator.h"
#include "qmesh/comm/deadline.h"
#include "qmesh/error.h"
#include "timeout_text.h"

namespace qmesh {

namespace {

void check_key(const std::string& key) {
  const bool ok = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  QMESH_CHECK(ok, "store key '", key, "' must be non-empty and made of [A-Za-z0-9._-]");
}

}  // namespace

Store::~Store() = default;

std::string Store::get(const std::string& key) { return get(key, comm_timeout()); }

FileStore::FileStore(std::filesystem::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  QMESH_CHECK(!ec && std::filesystem::is_directory(dir_), "file store directory '", dir_.string(),
              "' cannot be created: ", ec.message());
}

void FileStore::set(const std::string& key, const std::string& value) {
  check_key(key);
  // A unique temporary name (keys never start with '#'), then an atomic rename.
  thread_local std::mt19937_64 random{std::random_device{}()};
  const auto tmp =
      dir_ / ("#" + key + "." + std::to_string(getpid()) + "." + std::to_string(random()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    out.close();
    QMESH_CHECK(out.good(), "file store cannot write '", tmp.string(), "'");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, dir_ / key, ec);
  QMESH_CHECK(!ec, "file store cannot rename '", tmp.string(), "' to key '", key,
              "': ", ec.message());
}

std::string FileStore::get(const std::string& key, std::chrono::milliseconds timeout) {
  check_key(key);
  const auto path = dir_ / key;
  const Deadline deadline(timeout);
  auto pause = std::chrono::microseconds(100);
  for (;;) {
    std::ifstream in(path, std::ios::binary);
    if (in) {
      std::ostringstream value;
      value << in.rdbuf();
      return value.str();
    }
    QMESH_CHECK_KIND(ErrorKind::kTimeout, !deadline.passed(), "file store key '", key,
                     "' did not appear in '", dir_.string(), "' within ", timeout.count(),
                     " ms: a rank did not publish it (is every rank using this directory?)");
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(20000));
  }
}

Bootstrap::~Bootstrap() = default;

std::vector<std::string> Bootstrap::all_gather(const std::string& mine) {
  return all_gather(mine, comm_timeout());
}

std::string Bootstrap::broadcast(const std::string& value, int root) {
  comm_check::peer(root, size(), "bootstrap broadcast root");
  return all_gather(rank() == root ? value : std::string())[root];
}

StoreBootstrap::StoreBootstrap(std::shared_ptr<Store> store, int rank, int size, std::string prefix)
    : store_(std::move(store)), rank_(rank), size_(size), prefix_(std::move(prefix)) {
  QMESH_CHECK(store_ != nullptr, "StoreBootstrap needs a store");
  QMESH_CHECK(size_ >= 1, "bootstrap size ", size_, " must be >= 1");
  comm_check::peer(rank_, size_, "bootstrap rank");
  check_key(prefix_);
}

std::vector<std::string> StoreBootstrap::all_gather(const std::string& mine,
                                                    std::chrono::milliseconds timeout) {
  const Deadline deadline(timeout);
  const std::string round = prefix_ + "." + std::to_string(round_++) + ".";
  store_->set(round + std::to_string(rank_), mine);
  std::vector<std::string> all(size_);
  for (int r = 0; r < size_; ++r) {
    try {
      all[r] = store_->get(round + std::to_string(r), deadline.left());
    } catch (const Error& e) {  // Store::get throws when the key has not appeared in time
      QMESH_THROW_KIND(e.kind(), "bootstrap all_gather (rank ", rank_, " of ", size_,
                       "): ", comm_detail::never_joined_text({r}, "all_gather"), " (", e.message(),
                       ")");
    }
  }
  return all;
}

namespace {

// Byte strings over a communicator's int32 all-gathers: lengths first, then the strings
// padded to the longest.
class CommBootstrap : public Bootstrap {
 public:
  explicit CommBootstrap(std::shared_ptr<Communicator> comm) : comm_(std::move(comm)) {
    QMESH_CHECK(comm_ != nullptr, "make_comm_bootstrap needs a communicator");
  }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }

  std::vector<std::string> all_gather(const std::string& mine,
                                      std::chrono::milliseconds timeout) override {
    const Deadline deadline(timeout);
    const int n = size();
    QMESH_CHECK(mine.size() < (1u << 30), "bootstrap value of ", mine.size(),
                " bytes is too large (limit 1 GiB)");
    int32_t length = static_cast<int32_t>(mine.size());
    std::vector<int32_t> lengths(n);
    comm_
        ->all_gather_async(TensorView(&length, DType::kInt32, Shape{1}),
                           TensorView(lengths.data(), DType::kInt32, Shape{n}))
        ->wait(deadline.left());
    const int64_t words = (*std::max_element(lengths.begin(), lengths.end()) + 3) / 4 + 1;
    std::vector<int32_t> padded(words, 0);
    std::copy(mine.begin(), mine.end(), reinterpret_cast<char*>(padded.data()));
    std::vector<int32_t> gathered(words * n);
    comm_
        ->all_gather_async(TensorView(padded.data(), DType::kInt32, Shape{words}),
                           TensorView(gathered.data(), DType::kInt32, Shape{words * n}))
        ->wait(deadline.left());
    std::vector<std::string> all(n);
    for (int r = 0; r < n; ++r) {
      all[r].assign(reinterpret_cast<const char*>(gathered.data() + r * words), lengths[r]);
    }
    return all;
  }
  using Bootstrap::all_gather;

 private:
  std::shared_ptr<Communicator> comm_;
};

}  // namespace

std::unique_ptr<Bootstrap> make_comm_bootstrap(std::shared_ptr<Communicator> comm) {
  return std::make_unique<CommBootstrap>(std::move(comm));
}

std::string host_name() {
  char name[256] = {};
  QMESH_CHECK(gethostname(name, sizeof(name) - 1) == 0, "gethostname failed");
  return name;
}

std::vector<int> number_hosts(const std::vector<std::string>& host_names) {
  std::map<std::string, int> ids;
  std::vector<int> out;
  for (const auto& name : host_names) {
    out.push_back(ids.try_emplace(name, static_cast<int>(ids.size())).first->second);
  }
  return out;
}

}  // namespace qmesh
