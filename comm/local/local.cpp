// The local backend: ranks are threads sharing a World. Point-to-point is a rendezvous (the
// later of send and receive copies the data); collectives run the ring algorithms on one
// worker thread per communicator, over a separate context so that they never match user
// messages.
#include "qmesh/comm/local.h"

#include <algorithm>
#include <climits>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "algorithms/ring.h"
#include "local/local_world.h"
#include "qmesh/comm/one_sided.h"
#include "qmesh/error.h"
#include "timeout_text.h"

namespace qmesh {

namespace local {
namespace {

// Runs tasks one after another on a thread of its own, started on first use.
class Worker {
 public:
  ~Worker() {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

  void submit(std::function<void()> task) {
    std::lock_guard lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    tasks_.push_back(std::move(task));
    cv_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      std::function<void()> task;
      {
        std::unique_lock lock(mu_);
        cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

// Buffers and put counters of one window, shared by its ranks; counters guarded by the
// world's mutex.
struct WindowShared {
  std::vector<TensorView> buffers;
  std::vector<uint64_t> arrived;
};

class LocalWindow : public Window {
 public:
  LocalWindow(std::shared_ptr<World> world, std::shared_ptr<WindowShared> shared, int rank)
      : world_(std::move(world)), shared_(std::move(shared)), rank_(rank) {}

  TensorView local() const override { return shared_->buffers[rank_]; }
  size_t peer_bytes(int peer) const override {
    comm_check::peer(peer, static_cast<int>(shared_->buffers.size()), "window peer");
    return shared_->buffers[peer].nbytes();
  }
  void wait_puts(uint64_t count, std::chrono::milliseconds timeout) override {
    std::unique_lock lock(world_->mu);
    uint64_t& arrived = shared_->arrived[rank_];
    world_->wait(
        lock, timeout, TimeoutSource::kEnvironment, [&] { return arrived >= count; },
        detail::concat("local wait for ", count, " puts on rank ", rank_));
    arrived -= count;
  }
  using Window::wait_puts;

  // Copies src into peer's buffer at `offset` and counts the arrival.
  void put(int peer, size_t offset, const TensorView& src, Stream stream) {
    comm_check::peer(peer, static_cast<int>(shared_->buffers.size()), "put peer");
    check_not_empty(src, "put source");
    const TensorView& target = shared_->buffers[peer];
    QMESH_CHECK(offset <= target.nbytes() && src.nbytes() <= target.nbytes() - offset, "put of ",
                src.nbytes(), " bytes at offset ", offset, " overruns the window buffer of rank ",
                peer, " (", target.nbytes(), " bytes)");
    comm_detail::copy_between({static_cast<char*>(target.data) + offset, target.device, stream},
                              {src.data, src.device, stream}, src.nbytes());
    std::lock_guard lock(world_->mu);
    ++shared_->arrived[peer];
    world_->cv.notify_all();
  }

 private:
  std::shared_ptr<World> world_;
  std::shared_ptr<WindowShared> shared_;
  int rank_;
};

class LocalComm;

// Point-to-point on one context of a communicator.
class Channel : public PointToPoint {
 public:
  Channel(LocalComm& comm, int ctx) : comm_(comm), ctx_(ctx) {}
  WorkHandle send_async(TensorView in, int peer, int tag, Stream stream = {}) override;
  WorkHandle recv_async(TensorView out, int peer, int tag, Stream stream = {}) override;
  int max_tag() const override { return INT_MAX; }

 private:
  LocalComm& comm_;
  int ctx_;
};

struct SplitArgs {
  int color;
  int key;
};

class LocalComm : public Communicator, public OneSided {
 public:
  // `world_ranks`: the world rank of each rank (empty when numbered as the world is).
  LocalComm(std::shared_ptr<World> world, int ctx, int rank, int size,
            comm_detail::WorldRanks world_ranks = {})
      : world_(std::move(world)),
        ctx_(ctx),
        rank_(rank),
        size_(size),
        world_ranks_(std::move(world_ranks)),
        user_(*this, ctx),
        coll_(*this, ctx + 1) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend_name() const override { return "local"; }
  World& world() { return *world_; }
  const comm_detail::WorldRanks& world_ranks() const { return world_ranks_; }

  WorkHandle send_async(TensorView in, int peer, int tag, Stream stream = {}) override {
    return user_.send_async(in, peer, tag, stream);
  }
  WorkHandle recv_async(TensorView out, int peer, int tag, Stream stream = {}) override {
    return user_.recv_async(out, peer, tag, stream);
  }
  int max_tag() const override { return INT_MAX; }

  WorkHandle all_reduce_async(TensorView buf, ReduceOp op, Stream stream = {}) override {
    comm_check::reducible(buf, "all_reduce buffer");
    return run_collective("all_reduce", [=](const algorithms::RingContext& ctx) {
      comm_detail::HostStage stage(buf, stream, true);
      algorithms::ring_all_reduce(ctx, stage.host(), op);
      stage.finish();
    });
  }

  WorkHandle all_gather_async(TensorView in, TensorView out, Stream stream = {}) override {
    comm_check::all_gather_args(in, out, size_);
    return run_collective("all_gather", [=](const algorithms::RingContext& ctx) {
      comm_detail::HostStage in_stage(in, stream, true);
      comm_detail::HostStage out_stage(out, stream, false);
      algorithms::ring_all_gather(ctx, in_stage.host(), out_stage.host());
      out_stage.finish();
    });
  }

  WorkHandle reduce_scatter_async(TensorView in, TensorView out, ReduceOp op,
                                  Stream stream = {}) override {
    comm_check::reduce_scatter_args(in, out, size_);
    return run_collective("reduce_scatter", [=](const algorithms::RingContext& ctx) {
      comm_detail::HostStage in_stage(in, stream, true);
      comm_detail::HostStage out_stage(out, stream, false);
      algorithms::ring_reduce_scatter(ctx, in_stage.host(), out_stage.host(), op);
      out_stage.finish();
    });
  }

  WorkHandle broadcast_async(TensorView buf, int root, Stream stream = {}) override {
    check_not_empty(buf, "broadcast buffer");
    comm_check::peer(root, size_, "broadcast root");
    return run_collective("broadcast", [=](const algorithms::RingContext& ctx) {
      comm_detail::HostStage stage(buf, stream, true);
      algorithms::ring_broadcast(ctx, stage.host(), root);
      stage.finish();
    });
  }

  WorkHandle barrier_async() override {
    return run_collective(
        "barrier", [](const algorithms::RingContext& ctx) { algorithms::ring_barrier(ctx); });
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    auto mine = std::make_shared<SplitArgs>(SplitArgs{color, key});
    // The last rank to arrive gives every colour its contexts.
    auto result = exchange("split", mine, [this](const World::Values& values) {
      auto contexts = std::make_shared<std::map<int, int>>();
      for (const auto& v : values) {
        const int c = static_cast<const SplitArgs*>(v.get())->color;
        if (c >= 0 && !contexts->count(c)) (*contexts)[c] = world_->new_contexts_locked();
      }
      return std::shared_ptr<const void>(contexts);
    });
    if (color < 0) return nullptr;
    std::vector<std::pair<int, int>> members;  // (key, old rank)
    for (int r = 0; r < size_; ++r) {
      const auto* args = static_cast<const SplitArgs*>(result.values[r].get());
      if (args->color == color) members.emplace_back(args->key, r);
    }
    std::sort(members.begin(), members.end());
    const int new_rank = static_cast<int>(
        std::find(members.begin(), members.end(), std::pair{key, rank_}) - members.begin());
    const auto& contexts = *static_cast<const std::map<int, int>*>(result.shared.get());
    comm_detail::WorldRanks world_ranks;
    bool as_world = static_cast<int>(members.size()) == world_->size();
    for (const auto& [member_key, old_rank] : members) {
      world_ranks.push_back(world_ranks_.empty() ? old_rank
                                                 : world_ranks_[static_cast<size_t>(old_rank)]);
      as_world = as_world && world_ranks.back() == static_cast<int>(world_ranks.size()) - 1;
    }
    if (as_world) world_ranks.clear();
    return with_my_timeout(std::make_shared<LocalComm>(world_, contexts.at(color), new_rank,
                                                       static_cast<int>(members.size()),
                                                       std::move(world_ranks)));
  }

  std::vector<int> host_ids() override { return std::vector<int>(size_, 0); }

  OneSided* one_sided() override { return this; }

  std::shared_ptr<Window> register_window(TensorView local_buffer) override {
    check_not_empty(local_buffer, "window buffer");
    auto mine = std::make_shared<TensorView>(local_buffer);
    auto result = exchange("register_window", mine, [](const World::Values& values) {
      auto shared = std::make_shared<WindowShared>();
      for (const auto& v : values)
        shared->buffers.push_back(*static_cast<const TensorView*>(v.get()));
      shared->arrived.assign(values.size(), 0);
      return std::shared_ptr<const void>(shared);
    });
    auto shared = std::const_pointer_cast<WindowShared>(
        std::static_pointer_cast<const WindowShared>(result.shared));
    return std::make_shared<LocalWindow>(world_, std::move(shared), rank_);
  }

  WorkHandle put_async(Window& window, int peer, size_t offset, TensorView src,
                       Stream stream = {}) override {
    auto* local_window = dynamic_cast<LocalWindow*>(&window);
    QMESH_CHECK(local_window != nullptr,
                "put_async on a window that the local backend did not register");
    auto state = std::make_shared<OpState>();
    local_window->put(peer, offset, src, stream);
    state->done = true;
    return work(state, describe("put"));
  }

  std::string describe(std::string_view op) const {
    return detail::concat("local ", op, " (rank ", rank_, " of ", size_, ")");
  }

  // A Work over `state` that keeps this communicator's timeout.
  WorkHandle work(std::shared_ptr<OpState> state, std::string what, World::Blame blame = {}) {
    return std::make_unique<LocalWork>(*this, world_, std::move(state), std::move(what),
                                       std::move(blame));
  }

 private:
  // Queues a ring collective on the worker; its deadline counts from now.
  template <class Fn>
  WorkHandle run_collective(std::string_view op, Fn fn) {
    auto state = std::make_shared<OpState>();
    const std::string what = describe(op);
    const std::string name(op);
    const auto limit = timeout();
    const auto source = timeout_source();
    const Deadline deadline(limit);
    World* world = world_.get();
    const int ctx = ctx_ + 1;
    const uint64_t seq = world->join(ctx, rank_, size_);
    auto absent = [world, ctx, seq] {
      std::lock_guard lock(world->mu);
      return world->absent_locked(ctx, seq);
    };
    worker_.submit([this, state, what, name, limit, source, deadline, absent, fn] {
      std::exception_ptr error;
      try {
        fn(algorithms::RingContext{
            coll_, rank_, size_, 0, deadline, limit, source, what, name, absent, {}, world_ranks_});
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard lock(world_->mu);
      state->error = error;
      state->done = true;
      world_->cv.notify_all();
    });
    return work(state, what, [world, ctx, seq, name, naming = world_ranks_] {
      const std::vector<int> missing = world->absent_locked(ctx, seq);
      return missing.empty() ? std::string()
                             : comm_detail::never_joined_text(missing, name, naming);
    });
  }

  struct Exchanged {
    World::Values values;
    std::shared_ptr<const void> shared;
  };
  // Blocking rendezvous of all ranks: every rank gets every value and what `finalize` made.
  Exchanged exchange(std::string_view op, std::shared_ptr<const void> mine,
                     std::function<std::shared_ptr<const void>(const World::Values&)> finalize) {
    auto combined = world_->exchange(
        ctx_, exchange_seq_++, rank_, size_, std::move(mine),
        [&finalize](const World::Values& values) {
          return std::shared_ptr<const void>(
              std::make_shared<Exchanged>(Exchanged{values, finalize(values)}));
        },
        timeout(), timeout_source(), describe(op), op, world_ranks_);
    return *static_cast<const Exchanged*>(combined.get());
  }

  std::shared_ptr<World> world_;
  int ctx_;
  int rank_;
  int size_;
  comm_detail::WorldRanks world_ranks_;
  uint64_t exchange_seq_ = 0;
  Channel user_;
  Channel coll_;
  Worker worker_;  // last: joined before the members its tasks use are destroyed
};

WorkHandle Channel::send_async(TensorView in, int peer, int tag, Stream stream) {
  check_not_empty(in, "send buffer");
  comm_check::peer(peer, comm_.size(), "send peer");
  comm_check::tag(tag, max_tag());
  auto state = std::make_shared<OpState>();
  comm_.world().post_send(ctx_, comm_.rank(), peer, tag,
                          Posted{{in.data, in.device, stream}, in.nbytes(), state});
  return comm_.work(state, comm_.describe(detail::concat("send to rank ", peer)),
                    [peer, tag, naming = comm_.world_ranks()] {
                      return comm_detail::p2p_wait_text(false, peer, tag, naming);
                    });
}

WorkHandle Channel::recv_async(TensorView out, int peer, int tag, Stream stream) {
  check_not_empty(out, "receive buffer");
  comm_check::peer(peer, comm_.size(), "receive peer");
  comm_check::tag(tag, max_tag());
  auto state = std::make_shared<OpState>();
  comm_.world().post_recv(ctx_, peer, comm_.rank(), tag,
                          Posted{{out.data, out.device, stream}, out.nbytes(), state});
  return comm_.work(state, comm_.describe(detail::concat("receive from rank ", peer)),
                    [peer, tag, naming = comm_.world_ranks()] {
                      return comm_detail::p2p_wait_text(true, peer, tag, naming);
                    });
}

}  // namespace
}  // namespace local

std::vector<std::shared_ptr<Communicator>> make_local_world(int n) {
  QMESH_CHECK(n >= 1, "local world size ", n, " must be >= 1");
  auto world = std::make_shared<local::World>(n);
  const int ctx = world->new_contexts();
  std::vector<std::shared_ptr<Communicator>> comms;
  for (int r = 0; r < n; ++r) comms.push_back(std::make_shared<local::LocalComm>(world, ctx, r, n));
  return comms;
}

void abort_local_world(Communicator& comm, const std::string& reason) {
  auto* local_comm = dynamic_cast<local::LocalComm*>(&comm);
  QMESH_CHECK(local_comm != nullptr,
              "abort_local_world needs a local communicator; got one of "
              "backend ",
              comm.backend_name());
  local_comm->world().abort(reason);
}

void run_local_ranks(int n, const std::function<void(Communicator& comm)>& fn) {
  auto comms = make_local_world(n);
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*comms[r]);
      } catch (...) {
        {
          std::lock_guard lock(mu);
          if (!first) first = std::current_exception();
        }
        std::string what = "an exception that is not a std::exception";
        try {
          throw;
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        abort_local_world(*comms[r], detail::concat("rank ", r, " failed: ", what));
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

}  // namespace qmesh
