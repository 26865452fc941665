// The UCX communicator: tagged point-to-point on a UCP worker, the ring collectives of
// comm/algorithms run as jobs of the worker's progress thread, and one-sided puts into
// windows registered with ucp_mem_map.
#include <algorithm>
#include <cstring>
#include <tuple>

#include "algorithms/ring.h"
#include "check.h"
#include "engine.h"
#include "qmesh/comm/one_sided.h"
#include "qmesh/comm/ucx.h"
#include "qmesh/logging.h"
#include "timeout_text.h"

namespace qmesh {
namespace ucx_detail {
namespace {

// A 64-bit UCP tag: channel (2 bits) | source rank (30 bits) | tag (32 bits). Receives
// match all 64 bits, so a receive takes only messages of its (channel, source, tag).
enum class Channel : uint64_t { kUser = 0, kCollective = 1 };
constexpr int kMaxRanks = 1 << 30;
constexpr int kMaxTag = 0x7fffffff;

ucp_tag_t make_tag(Channel channel, int source, int tag) {
  return (static_cast<uint64_t>(channel) << 62) | (static_cast<uint64_t>(source) << 32) |
         static_cast<uint32_t>(tag);
}

void require_host(const TensorView& t, std::string_view what) {
  QMESH_CHECK(t.device.is_host(), what, " is on ", t.device.str(),
              "; UCX communicators carry host buffers (use the NCCL backend for CUDA buffers)");
}

// The timeout a Work keeps, and where it was set.
struct Limit {
  std::chrono::milliseconds timeout;
  TimeoutSource source;
};

Limit limit_of(const Communicator& comm) { return {comm.timeout(), comm.timeout_source()}; }

// A Work over an Op of an engine. `owner` keeps the engine alive for works handed to the
// caller; works created by jobs of the engine's own thread leave it null. `blame` names the
// peer a timed-out wait waited for (empty: unknown). A ring collective (`ring`) notes, at its
// deadline, an error naming the peer its step waited for (Op::timeout_note): a wait that
// times out gives it a moment to do so (up to 1 s, and no longer than the wait's own
// timeout: a zero-timeout poll stays one) and reports it, rather than a vaguer error.
class UcxWork : public Work {
 public:
  UcxWork(std::shared_ptr<Engine> owner, Engine& engine, std::shared_ptr<Op> op, Limit limit,
          std::string blame = {}, bool ring = false)
      : Work(op->what, limit.timeout, limit.source),
        owner_(std::move(owner)),
        engine_(engine),
        op_(std::move(op)),
        blame_(std::move(blame)),
        ring_(ring) {}

  ~UcxWork() override { drop_unfinished(); }

 protected:
  bool poll() override {
    if (!op_->is_done()) engine_.progress();
    return finished();
  }

  bool block_until(const Deadline& deadline) override {
    engine_.wait_until([this] { return op_->is_done(); }, deadline);
    return finished();
  }

  std::optional<std::string> on_timeout(std::chrono::milliseconds timeout) override {
    if (ring_) {
      engine_.wait_until([this] { return op_->is_done() || op_->noted.load(); },
                         Deadline(std::min(timeout, kRingReportGrace)));
      if (!op_->is_done() && op_->noted.load(std::memory_order_acquire))
        QMESH_THROW_KIND(ErrorKind::kTimeout, op_->timeout_note);
    }
    if (finished()) return std::nullopt;
    if (blame_.empty()) return Work::on_timeout(timeout);
    return blame_ + comm_detail::slow_job_hint(timeout_source());
  }

 private:
  // Whether the op has completed; throws its error if it failed.
  bool finished() {
    if (!op_->is_done()) return false;
    if (op_->error) std::rethrow_exception(op_->error);
    return true;
  }

  static constexpr std::chrono::milliseconds kRingReportGrace{1000};

  std::shared_ptr<Engine> owner_;
  Engine& engine_;
  std::shared_ptr<Op> op_;
  std::string blame_;
  bool ring_;
};

// Point-to-point on a channel of an engine. The collective channel is what the ring
// algorithms run over, on the engine's thread, so its works do not own the engine. `limit`
// gives the timeout its works keep.
class TagChannel : public PointToPoint {
 public:
  TagChannel(Engine& engine, std::shared_ptr<Engine> owner, Channel channel, int rank, int size,
             std::function<Limit()> limit)
      : engine_(engine),
        owner_(std::move(owner)),
        channel_(channel),
        rank_(rank),
        size_(size),
        limit_(std::move(limit)) {}

  WorkHandle send_async(TensorView in, int peer, int tag, Stream = {}) override {
    check(in, peer, tag, "send");
    auto op = engine_.tag_send(peer, in.data, in.nbytes(), make_tag(channel_, rank_, tag),
                               detail::concat("ucx send of ", in.nbytes(), " bytes from rank ",
                                              rank_, " to rank ", peer, " (tag ", tag, ")"));
    return std::make_unique<UcxWork>(owner_, engine_, std::move(op), limit_(),
                                     comm_detail::p2p_wait_text(false, peer, tag));
  }

  WorkHandle recv_async(TensorView out, int peer, int tag, Stream = {}) override {
    check(out, peer, tag, "receive");
    auto op = engine_.tag_recv(out.data, out.nbytes(), make_tag(channel_, peer, tag),
                               detail::concat("ucx receive of ", out.nbytes(), " bytes on rank ",
                                              rank_, " from rank ", peer, " (tag ", tag, ")"));
    return std::make_unique<UcxWork>(owner_, engine_, std::move(op), limit_(),
                                     comm_detail::p2p_wait_text(true, peer, tag));
  }

  int max_tag() const override { return kMaxTag; }

 private:
  void check(const TensorView& t, int peer, int tag, std::string_view side) const {
    comm_check::message_args(t, peer, size_, tag, kMaxTag, side);
    require_host(t, detail::concat(side, " buffer"));
  }

  Engine& engine_;
  std::shared_ptr<Engine> owner_;
  Channel channel_;
  int rank_;
  int size_;
  std::function<Limit()> limit_;
};

// Memory registered with the context; unmapped on destruction.
class Registration {
 public:
  Registration(ucp_context_h context, void* data, size_t bytes) : context_(context) {
    ucp_mem_map_params_t params{};
    params.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
    params.address = data;
    params.length = bytes;
    QMESH_CHECK_UCX(ucp_mem_map(context_, &params, &memh_));
  }
  ~Registration() { ucp_mem_unmap(context_, memh_); }
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;

  // The packed remote key peers unpack to access this memory.
  std::string packed_rkey() const {
    void* buffer = nullptr;
    size_t size = 0;
    QMESH_CHECK_UCX(ucp_rkey_pack(context_, memh_, &buffer, &size));
    std::string out(static_cast<const char*>(buffer), size);
    ucp_rkey_buffer_release(buffer);
    return out;
  }

 private:
  ucp_context_h context_;
  ucp_mem_h memh_ = nullptr;
};

// What a rank publishes about its window: addresses, size, and the two packed keys.
struct WindowRecord {
  uint64_t data_address = 0;
  uint64_t data_bytes = 0;
  uint64_t counter_address = 0;
  std::string data_rkey;
  std::string counter_rkey;

  std::string serialize() const {
    const uint64_t header[5] = {data_address, data_bytes, counter_address, data_rkey.size(),
                                counter_rkey.size()};
    std::string out(reinterpret_cast<const char*>(header), sizeof(header));
    return out + data_rkey + counter_rkey;
  }

  static WindowRecord parse(const std::string& bytes) {
    uint64_t header[5];
    QMESH_CHECK(bytes.size() >= sizeof(header), "malformed UCX window record");
    std::memcpy(header, bytes.data(), sizeof(header));
    QMESH_CHECK(bytes.size() == sizeof(header) + header[3] + header[4],
                "malformed UCX window record");
    WindowRecord r{header[0], header[1], header[2], {}, {}};
    r.data_rkey = bytes.substr(sizeof(header), header[3]);
    r.counter_rkey = bytes.substr(sizeof(header) + header[3], header[4]);
    return r;
  }
};

ucp_rkey_h unpack_rkey(ucp_ep_h ep, const std::string& packed) {
  ucp_rkey_h rkey = nullptr;
  QMESH_CHECK_UCX(ucp_ep_rkey_unpack(ep, packed.data(), &rkey));
  return rkey;
}

class UcxWindow : public Window {
 public:
  UcxWindow(std::shared_ptr<Engine> engine, TensorView local)
      : engine_(std::move(engine)),
        local_(local),
        data_reg_(engine_->context()->handle(), local.data, local.nbytes()),
        counter_reg_(engine_->context()->handle(), &counter_, sizeof(counter_)) {}

  ~UcxWindow() override {
    for (RemoteRegion& r : remotes_) {
      if (r.data_rkey != nullptr) ucp_rkey_destroy(r.data_rkey);
      if (r.counter_rkey != nullptr) ucp_rkey_destroy(r.counter_rkey);
    }
  }

  std::string record() const {
    return WindowRecord{reinterpret_cast<uint64_t>(local_.data), local_.nbytes(),
                        reinterpret_cast<uint64_t>(&counter_), data_reg_.packed_rkey(),
                        counter_reg_.packed_rkey()}
        .serialize();
  }

  void connect(const std::vector<std::string>& records) {
    for (size_t peer = 0; peer < records.size(); ++peer) {
      const WindowRecord r = WindowRecord::parse(records[peer]);
      remotes_.push_back({r.data_address, r.data_bytes, r.counter_address, nullptr, nullptr});
      ucp_ep_h ep = engine_->endpoint(static_cast<int>(peer));
      remotes_.back().data_rkey = unpack_rkey(ep, r.data_rkey);
      remotes_.back().counter_rkey = unpack_rkey(ep, r.counter_rkey);
    }
  }

  TensorView local() const override { return local_; }
  size_t peer_bytes(int peer) const override { return remote(peer).data_bytes; }
  const Engine* engine() const { return engine_.get(); }
  const RemoteRegion& remote(int peer) const {
    comm_check::peer(peer, static_cast<int>(remotes_.size()), "window peer");
    return remotes_[static_cast<size_t>(peer)];
  }

  // A put by this rank into its own buffer.
  void put_local(size_t offset, const TensorView& src) {
    std::memcpy(static_cast<char*>(local_.data) + offset, src.data, src.nbytes());
    std::atomic_ref<uint64_t>(counter_).fetch_add(1, std::memory_order_acq_rel);
  }

  void wait_puts(uint64_t count, std::chrono::milliseconds timeout) override {
    // The counter is written by UCX (a remote atomic, or its emulation by this worker).
    std::atomic_ref<uint64_t> arrived(counter_);
    const bool done = engine_->wait_until(
        [&] { return arrived.load(std::memory_order_acquire) - consumed_ >= count; },
        Deadline(timeout));
    if (!done) {
      QMESH_THROW_KIND(
          ErrorKind::kTimeout,
          comm_detail::timeout_text("ucx wait_puts", timeout, TimeoutSource::kEnvironment), ": ",
          arrived.load() - consumed_, " of ", count,
          " expected puts arrived; a peer may have failed or issued fewer puts (raise "
          "QMESH_COMM_TIMEOUT_S if the job is only slow)");
    }
    consumed_ += count;
  }
  using Window::wait_puts;

 private:
  std::shared_ptr<Engine> engine_;
  TensorView local_;
  alignas(8) uint64_t counter_ = 0;  // puts arrived into local_
  uint64_t consumed_ = 0;            // puts taken by wait_puts
  Registration data_reg_;
  Registration counter_reg_;
  std::vector<RemoteRegion> remotes_;
};

class UcxComm final : public Communicator,
                      public OneSided,
                      public std::enable_shared_from_this<UcxComm> {
 public:
  UcxComm(std::shared_ptr<Engine> engine, int rank, int size)
      : engine_(std::move(engine)),
        rank_(rank),
        size_(size),
        user_(*engine_, engine_, Channel::kUser, rank, size, [this] { return limit_of(*this); }) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend_name() const override { return "ucx"; }
  OneSided* one_sided() override { return this; }

  WorkHandle send_async(TensorView in, int peer, int tag, Stream stream) override {
    return user_.send_async(in, peer, tag, stream);
  }
  WorkHandle recv_async(TensorView out, int peer, int tag, Stream stream) override {
    return user_.recv_async(out, peer, tag, stream);
  }
  int max_tag() const override { return kMaxTag; }

  WorkHandle all_reduce_async(TensorView buf, ReduceOp op, Stream) override {
    comm_check::reducible(buf, "all_reduce buffer");
    require_host(buf, "all_reduce buffer");
    return run_ring("all_reduce", [buf, op](const algorithms::RingContext& ctx) {
      algorithms::ring_all_reduce(ctx, buf, op);
    });
  }

  WorkHandle all_gather_async(TensorView in, TensorView out, Stream) override {
    comm_check::all_gather_args(in, out, size_);
    require_host(in, "all_gather input");
    return run_ring("all_gather", [in, out](const algorithms::RingContext& ctx) {
      algorithms::ring_all_gather(ctx, in, out);
    });
  }

  WorkHandle reduce_scatter_async(TensorView in, TensorView out, ReduceOp op, Stream) override {
    comm_check::reduce_scatter_args(in, out, size_);
    require_host(in, "reduce_scatter input");
    return run_ring("reduce_scatter", [in, out, op](const algorithms::RingContext& ctx) {
      algorithms::ring_reduce_scatter(ctx, in, out, op);
    });
  }

  WorkHandle broadcast_async(TensorView buf, int root, Stream) override {
    check_not_empty(buf, "broadcast buffer");
    require_host(buf, "broadcast buffer");
    comm_check::peer(root, size_, "broadcast root");
    return run_ring("broadcast", [buf, root](const algorithms::RingContext& ctx) {
      algorithms::ring_broadcast(ctx, buf, root);
    });
  }

  WorkHandle barrier_async() override {
    return run_ring("barrier",
                    [](const algorithms::RingContext& ctx) { algorithms::ring_barrier(ctx); });
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    // The new worker exists before its address is published, so early messages to it wait
    // in its unexpected queue.
    auto child = std::make_shared<Engine>(engine_->context());
    const int32_t header[2] = {color, key};
    std::string mine(reinterpret_cast<const char*>(header), sizeof(header));
    const std::vector<std::string> all =
        make_comm_bootstrap(shared_from_this())->all_gather(mine + child->address(), timeout());
    if (color < 0) return nullptr;
    std::vector<std::tuple<int, int, std::string>> members;  // key, old rank, address
    for (int r = 0; r < size_; ++r) {
      int32_t theirs[2];
      std::memcpy(theirs, all[r].data(), sizeof(theirs));
      if (theirs[0] == color) members.emplace_back(theirs[1], r, all[r].substr(sizeof(theirs)));
    }
    std::sort(members.begin(), members.end());
    std::vector<std::string> addresses;
    int new_rank = -1;
    for (const auto& [k, old_rank, address] : members) {
      if (old_rank == rank_) new_rank = static_cast<int>(addresses.size());
      addresses.push_back(address);
    }
    child->connect(addresses);
    auto comm =
        std::make_shared<UcxComm>(std::move(child), new_rank, static_cast<int>(addresses.size()));
    with_my_timeout(comm);
    return connected(std::move(comm));
  }

  // Returns `comm` once every member has connected its endpoints: until then no member may
  // destroy its worker (shared-memory transports attach to a peer's live segments while
  // connecting).
  static std::shared_ptr<Communicator> connected(std::shared_ptr<UcxComm> comm) {
    comm->barrier();
    return comm;
  }

  std::vector<int> host_ids() override {
    return number_hosts(
        make_comm_bootstrap(shared_from_this())->all_gather(host_name(), timeout()));
  }

  std::shared_ptr<Window> register_window(TensorView local) override {
    check_not_empty(local, "window buffer");
    require_host(local, "window buffer");
    auto window = std::make_shared<UcxWindow>(engine_, local);
    window->connect(
        make_comm_bootstrap(shared_from_this())->all_gather(window->record(), timeout()));
    return window;
  }

  WorkHandle put_async(Window& window, int peer, size_t offset, TensorView src, Stream) override {
    auto* ucx_window = dynamic_cast<UcxWindow*>(&window);
    QMESH_CHECK(ucx_window != nullptr && ucx_window->engine() == engine_.get(),
                "put_async: the window was not registered on this UCX communicator");
    check_not_empty(src, "put source");
    require_host(src, "put source");
    comm_check::peer(peer, size_, "put peer");
    const RemoteRegion& remote = ucx_window->remote(peer);
    QMESH_CHECK(offset <= remote.data_bytes && src.nbytes() <= remote.data_bytes - offset,
                "put of ", src.nbytes(), " bytes at offset ", offset,
                " overruns the window buffer of rank ", peer, " (", remote.data_bytes, " bytes)");
    if (peer == rank_) {
      // A put into this rank's own window is a copy (what the put would amount to anyway).
      ucx_window->put_local(offset, src);
      auto op = std::make_shared<Op>("ucx put to self");
      op->complete();
      return std::make_unique<UcxWork>(engine_, *engine_, std::move(op), limit_of(*this));
    }
    auto op = engine_->put_signal(peer, remote, offset, src.data, src.nbytes(),
                                  detail::concat("ucx put of ", src.nbytes(), " bytes from rank ",
                                                 rank_, " to rank ", peer, " at offset ", offset));
    return std::make_unique<UcxWork>(engine_, *engine_, std::move(op), limit_of(*this));
  }

 private:
  // Runs a ring collective as a job of the engine's thread, over the collective channel with
  // a fresh tag (ranks issue collectives in the same order, so they agree on it).
  template <class Fn>
  WorkHandle run_ring(std::string_view name, Fn fn) {
    const std::string what = detail::concat("ucx ", name, " (rank ", rank_, " of ", size_, ")");
    auto op = std::make_shared<Op>(what);
    const int tag = static_cast<int>(next_tag_++ & static_cast<uint32_t>(kMaxTag));
    const Limit limit = limit_of(*this);
    const Deadline deadline(limit.timeout);
    Engine* engine = engine_.get();
    engine_->submit([engine, op, fn, tag, limit, deadline, name = std::string(name), rank = rank_,
                     size = size_]() {
      try {
        TagChannel channel(*engine, nullptr, Channel::kCollective, rank, size,
                           [limit] { return limit; });
        fn(algorithms::RingContext{channel,
                                   rank,
                                   size,
                                   tag,
                                   deadline,
                                   limit.timeout,
                                   limit.source,
                                   op->what,
                                   name,
                                   {},
                                   [&op](const std::string& message) {
                                     op->timeout_note = message;
                                     op->noted.store(true, std::memory_order_release);
                                   },
                                   {}});
        op->complete();
      } catch (...) {
        op->complete(std::current_exception());
      }
    });
    return std::make_unique<UcxWork>(engine_, *engine_, std::move(op), limit, std::string(), true);
  }

  std::shared_ptr<Engine> engine_;
  int rank_;
  int size_;
  TagChannel user_;
  uint32_t next_tag_ = 0;
};

}  // namespace
}  // namespace ucx_detail

std::shared_ptr<Communicator> make_ucx_world(Bootstrap& bootstrap) {
  using namespace ucx_detail;
  QMESH_CHECK(bootstrap.size() >= 1 && bootstrap.size() < kMaxRanks, "bootstrap size ",
              bootstrap.size(), " is out of range [1, ", kMaxRanks, ")");
  auto engine = std::make_shared<Engine>(std::make_shared<Context>());
  engine->connect(bootstrap.all_gather(engine->address()));
  return UcxComm::connected(
      std::make_shared<UcxComm>(std::move(engine), bootstrap.rank(), bootstrap.size()));
}

}  // namespace qmesh
