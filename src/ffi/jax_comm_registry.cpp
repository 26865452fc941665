// The registry of the communicators of qmesh.jax's collective GEMMs (jax_comm_registry.h) and
// the C entry points that python/qmesh/jax/comm_registry.py calls through ctypes to fill it.
//
// A registered communicator holds groups x size ranks: one world of `size` ranks per index
// combination of the mesh's other axes; its id is the handlers' attribute `comm`.
// - qmesh_jax_make_local_comm: every rank in this process (the local backend).
// - qmesh_jax_reserve_comm, then qmesh_jax_join_comm once per rank of this process, each on a
//   thread of its own and all at once (the creation is collective over the world): a world
//   across processes (UCX on the CPU, NCCL on GPUs) bootstrapped through a key-value store,
//   either a FileStore directory or the caller's two callbacks (jax.distributed's store).
// Worlds live until the process ends. Nothing is thrown across the C boundary.
#include "ffi/jax_comm_registry.h"

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "qmesh/comm/bootstrap.h"
#include "qmesh/comm/local.h"
#include "qmesh/comm/work.h"
#include "qmesh/config.h"
#include "qmesh/device.h"
#if QMESH_WITH_UCX
#include "qmesh/comm/ucx.h"
#endif
#if QMESH_WITH_NCCL
#include "qmesh/comm/nccl.h"
#endif

extern "C" {
// The callbacks of a key-value store. set publishes `size` bytes of `value` under `key` and
// returns 0 (else nonzero). get waits up to timeout_ms for `key`, hands its value to
// qmesh_jax_store_reply(reply, ...) and returns 0; it returns 1 when the key did not appear in
// time, another value on other failures. Both may be called from several threads at once.
typedef int (*qmesh_jax_store_set)(const char* key, const char* value, size_t size);
typedef int (*qmesh_jax_store_get)(const char* key, int64_t timeout_ms, void* reply);
}

namespace qmesh::ffi {
namespace {

// The worlds of one registered (mesh, axis): groups[g][r] is rank r of group g (no
// communicator for the ranks that other processes hold).
using Worlds = std::vector<std::vector<Rank>>;

std::mutex registry_mutex;
std::deque<Worlds> registry;  // the id is the index; a deque keeps elements in place

int64_t add(Worlds worlds) {
  const std::lock_guard<std::mutex> lock(registry_mutex);
  registry.push_back(std::move(worlds));
  return int64_t(registry.size()) - 1;
}

// A Store over the callbacks of the caller (used during creation only).
class CallbackStore : public Store {
 public:
  CallbackStore(qmesh_jax_store_set set_fn, qmesh_jax_store_get get_fn)
      : set_(set_fn), get_(get_fn) {}

  void set(const std::string& key, const std::string& value) override {
    QMESH_CHECK_KIND(ErrorKind::kRuntime, set_(key.c_str(), value.data(), value.size()) == 0,
                     "the key-value store could not set '", key, "'");
  }

  std::string get(const std::string& key, std::chrono::milliseconds timeout) override {
    std::string value;
    const int rc = get_(key.c_str(), std::max<int64_t>(1, timeout.count()), &value);
    QMESH_CHECK_KIND(ErrorKind::kTimeout, rc != 1, "key '", key,
                     "' did not appear in the key-value store within ", timeout.count(), " ms");
    QMESH_CHECK_KIND(ErrorKind::kRuntime, rc == 0, "the key-value store could not get '", key, "'");
    return value;
  }
  using Store::get;

 private:
  qmesh_jax_store_set set_;
  qmesh_jax_store_get get_;
};

// A bootstrap whose exchanges wait at most `bound` (the communicator's timeout), whatever
// the backend asks for.
class BoundedBootstrap : public Bootstrap {
 public:
  BoundedBootstrap(Bootstrap& inner, std::chrono::milliseconds bound)
      : inner_(inner), bound_(bound) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  std::vector<std::string> all_gather(const std::string& mine,
                                      std::chrono::milliseconds timeout) override {
    return inner_.all_gather(mine, std::min(timeout, bound_));
  }
  using Bootstrap::all_gather;

 private:
  Bootstrap& inner_;
  std::chrono::milliseconds bound_;
};

enum Backend { kUcx = 1, kNccl = 2 };

std::shared_ptr<Communicator> make_world(int backend, [[maybe_unused]] int device,
                                         [[maybe_unused]] Bootstrap& bootstrap) {
  if (backend == kUcx) {
#if QMESH_WITH_UCX
    return make_ucx_world(bootstrap);
#else
    QMESH_THROW_KIND(ErrorKind::kUnsupported,
                     "a mesh axis across processes needs the UCX backend on the CPU, and this "
                     "qmesh was built without it (QMESH_WITH_UCX=OFF; the wheel has none): "
                     "build qmesh with UCX (libucx-dev), or keep the axis inside each process");
#endif
  }
  QMESH_CHECK(backend == kNccl, "backend must be 1 (UCX) or 2 (NCCL), not ", backend);
#if QMESH_WITH_NCCL
  const DeviceGuard guard(device);
  return make_nccl_world(bootstrap);
#else
  QMESH_THROW_KIND(ErrorKind::kUnsupported,
                   "the collective GEMMs on GPUs need the NCCL backend, and this qmesh was "
                   "built without it (QMESH_WITH_NCCL=OFF): build qmesh with CUDA and NCCL");
#endif
}

void join(int64_t id, int group, int rank, int backend, int device,
          const std::shared_ptr<Store>& store, const std::string& prefix,
          std::chrono::milliseconds timeout) {
  size_t size = 0;
  {
    const std::lock_guard<std::mutex> lock(registry_mutex);
    QMESH_CHECK(id >= 0 && size_t(id) < registry.size(), "no communicator has the id ", id);
    const Worlds& worlds = registry[size_t(id)];
    QMESH_CHECK(group >= 0 && size_t(group) < worlds.size(), "group ", group,
                " is outside communicator ", id);
    size = worlds[size_t(group)].size();
  }
  QMESH_CHECK(rank >= 0 && size_t(rank) < size, "rank ", rank, " is outside a world of ", size);
  StoreBootstrap bootstrap(store, rank, int(size), prefix);
  BoundedBootstrap bounded(bootstrap, timeout);
  std::shared_ptr<Communicator> comm = make_world(backend, device, bounded);
  comm->set_timeout(timeout);
  const std::lock_guard<std::mutex> lock(registry_mutex);
  registry[size_t(id)][size_t(group)][size_t(rank)].comm = std::move(comm);
}

void copy_message(const char* message, char* out, size_t out_size) {
  if (out == nullptr || out_size == 0) return;
  std::strncpy(out, message, out_size - 1);
  out[out_size - 1] = '\0';
}

}  // namespace

Rank& rank_of(int64_t id, const AnyBuffer& coords) {
  require_dtype(coords, {DType::kInt32}, "coords (int32 [2]: group, rank on the axis)");
  require_count(coords, 2, "coords (int32 [2]: group, rank on the axis)");
  const auto* c = static_cast<const int32_t*>(coords.untyped_data());
  const std::lock_guard<std::mutex> lock(registry_mutex);
  QMESH_CHECK(id >= 0 && size_t(id) < registry.size(), "no communicator has the id ", id,
              ": make one with qmesh.jax.collective_gemm.communicator(mesh, axis)");
  Worlds& worlds = registry[size_t(id)];
  QMESH_CHECK(c[0] >= 0 && size_t(c[0]) < worlds.size() && c[1] >= 0 &&
                  size_t(c[1]) < worlds[size_t(c[0])].size(),
              "coords (group ", c[0], ", rank ", c[1], ") are outside communicator ", id, " (",
              worlds.size(), " groups of ", worlds.empty() ? 0 : worlds[0].size(), " ranks)");
  Rank& rank = worlds[size_t(c[0])][size_t(c[1])];
  QMESH_CHECK(rank.comm != nullptr, "rank ", c[1], " of group ", c[0], " of communicator ", id,
              " belongs to another process: the mesh given to the communicator must be the "
              "one the computation runs on");
  return rank;
}

}  // namespace qmesh::ffi

extern "C" {

// Makes `groups` local worlds of `size` ranks whose waits time out after timeout_ms (> 0;
// 0: comm_timeout()) and returns their id (>= 0), or -1 for groups < 1, size < 1 or
// timeout_ms < 0.
QMESH_API int64_t qmesh_jax_make_local_comm(int groups, int size, int64_t timeout_ms) {
  using namespace qmesh::ffi;
  if (groups < 1 || size < 1 || timeout_ms < 0) return -1;
  try {
    Worlds worlds;
    for (int g = 0; g < groups; ++g) {
      worlds.emplace_back();
      for (auto& comm : qmesh::make_local_world(size)) {
        if (timeout_ms > 0) comm->set_timeout(std::chrono::milliseconds(timeout_ms));
        worlds.back().push_back(Rank{std::move(comm)});
      }
    }
    return add(std::move(worlds));
  } catch (...) {
    return -1;
  }
}

// Registers `groups` worlds of `size` ranks without communicators (qmesh_jax_join_comm
// makes those of this process) and returns their id, or -1 for groups < 1 or size < 1.
QMESH_API int64_t qmesh_jax_reserve_comm(int groups, int size) {
  using namespace qmesh::ffi;
  if (groups < 1 || size < 1) return -1;
  try {
    Worlds worlds(static_cast<size_t>(groups));
    for (auto& world : worlds) world.resize(size_t(size));
    return add(std::move(worlds));
  } catch (...) {
    return -1;
  }
}

// Bitmask of the backends this build can make with qmesh_jax_join_comm: 1 UCX, 2 NCCL.
QMESH_API int qmesh_jax_comm_backends() {
  return (QMESH_WITH_UCX ? 1 : 0) | (QMESH_WITH_NCCL ? 2 : 0);
}

// Collective over the `size` ranks of group `group` of reserved communicator `id`: makes rank
// `rank`'s communicator of `backend` (1 UCX, 2 NCCL on CUDA device `device`), its waits and
// the creation itself bounded by timeout_ms (0: comm_timeout()). The ranks meet through `store_dir`
// (a FileStore directory) when it is not null, else through set/get; keys start with `prefix` (made
// of [A-Za-z0-9._-], the same in every process, unique per world). Returns 0, or -1 with the reason
// in `error` (error_size bytes, NUL-terminated).
QMESH_API int qmesh_jax_join_comm(int64_t id, int group, int rank, int backend, int device,
                                  const char* store_dir, qmesh_jax_store_set set,
                                  qmesh_jax_store_get get, const char* prefix, int64_t timeout_ms,
                                  char* error, size_t error_size) {
  using namespace qmesh::ffi;
  try {
    QMESH_CHECK(timeout_ms >= 0, "timeout_ms must be >= 0, not ", timeout_ms);
    QMESH_CHECK(prefix != nullptr, "the store key prefix is missing");
    QMESH_CHECK(store_dir != nullptr || (set != nullptr && get != nullptr),
                "give a store directory or both store callbacks");
    std::shared_ptr<qmesh::Store> store;
    if (store_dir != nullptr)
      store = std::make_shared<qmesh::FileStore>(store_dir);
    else
      store = std::make_shared<CallbackStore>(set, get);
    join(id, group, rank, backend, device, store, prefix,
         timeout_ms > 0 ? std::chrono::milliseconds(timeout_ms) : qmesh::comm_timeout());
    return 0;
  } catch (const std::exception& e) {
    copy_message(e.what(), error, error_size);
  } catch (...) {
    copy_message("unknown error", error, error_size);
  }
  return -1;
}

// Gives `size` bytes of `value` to the `reply` of a qmesh_jax_store_get callback.
QMESH_API void qmesh_jax_store_reply(void* reply, const char* value, size_t size) {
  static_cast<std::string*>(reply)->assign(value, size);
}

}  // extern "C"
