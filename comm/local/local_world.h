// Shared state of one local (threads) world: message matching, rendezvous for blocking
// collectives (split, window registration) and the abort flag. Internal to the local backend.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "qmesh/comm/work.h"
#include "stream_copy.h"
#include "timeout_text.h"

namespace qmesh::local {

using Clock = std::chrono::steady_clock;

// Completion of one operation; guarded by the world's mutex.
struct OpState {
  bool done = false;
  std::exception_ptr error;
};

// A posted send or receive waiting for its match.
struct Posted {
  comm_detail::Endpoint buffer;
  size_t bytes = 0;
  std::shared_ptr<OpState> state;
};

class World : public std::enable_shared_from_this<World> {
 public:
  explicit World(int size) : size_(size) {}
  int size() const { return size_; }

  // Two fresh context ids (point-to-point, collectives) for a new communicator.
  int new_contexts();
  int new_contexts_locked();  // the same, with `mu` held by the caller

  // Posts a send (src -> dst within context ctx) or a receive; when it matches the oldest
  // opposite posting with the same key, the data is copied and both complete.
  void post_send(int ctx, int src, int dst, int tag, Posted send);
  void post_recv(int ctx, int src, int dst, int tag, Posted recv);

  // Blocks (lock held) until done() or the deadline; returns done(). Throws, naming `what`,
  // the abort reason when the world is aborted.
  bool wait_until(std::unique_lock<std::mutex>& lock, const Deadline& deadline,
                  const std::function<bool()>& done, const std::string& what);

  // wait_until() for `timeout`, which throws on timeout: "<what> timed out after ...: " and
  // what `blame` (called with the lock held) says about the peer(s) waited for (empty or ""
  // if it cannot tell). `source`: where the timeout was set.
  using Blame = std::function<std::string()>;
  void wait(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout,
            TimeoutSource source, const std::function<bool()>& done, const std::string& what,
            const Blame& blame = {});

  // Records that `rank` (of `size`) of context ctx has called its next collective there;
  // returns that call's number (1, 2, ...).
  uint64_t join(int ctx, int rank, int size);
  // With `mu` held: the ranks of context ctx that have not yet called collective number `seq`.
  std::vector<int> absent_locked(int ctx, uint64_t seq) const;

  // Rendezvous of the `size` ranks of context ctx for their call number `seq`: each passes
  // a value; the last to arrive runs `finalize` over all values (in rank order), and every
  // rank returns what it produced. Bounded by `timeout` (from `source`); a timeout names the
  // ranks that never arrived at `op` (and their world ranks, by `world`).
  using Values = std::vector<std::shared_ptr<const void>>;
  std::shared_ptr<const void> exchange(
      int ctx, uint64_t seq, int rank, int size, std::shared_ptr<const void> value,
      const std::function<std::shared_ptr<const void>(const Values&)>& finalize,
      std::chrono::milliseconds timeout, TimeoutSource source, const std::string& what,
      std::string_view op, const comm_detail::WorldRanks& world);

  void abort(const std::string& reason);

  // With `mu` held: withdraws a posted, still unmatched send or receive whose completion is
  // `state`, which then completes with `error`. False if there is none (already matched,
  // or not a point-to-point operation).
  bool cancel_locked(const std::shared_ptr<OpState>& state, std::exception_ptr error);

  std::mutex mu;
  std::condition_variable cv;

 private:
  using Key = std::tuple<int, int, int, int>;  // ctx, src, dst, tag
  void match(Posted& send, Posted& recv);

  struct Slot {
    Values values;
    int arrived = 0;
    int left = 0;
    std::shared_ptr<const void> result;
  };

  int size_;
  int next_context_ = 0;
  bool aborted_ = false;
  std::string abort_reason_;
  std::map<Key, std::deque<Posted>> sends_;
  std::map<Key, std::deque<Posted>> recvs_;
  std::map<std::pair<int, uint64_t>, Slot> slots_;
  std::map<int, std::vector<uint64_t>> joined_;  // per context: collectives called, per rank
};

// A Work over an OpState of a world; `blame` names the peer(s) a timed-out wait waited for
// (see World::wait).
class LocalWork : public Work {
 public:
  LocalWork(const Communicator& issuer, std::shared_ptr<World> world,
            std::shared_ptr<OpState> state, std::string what, World::Blame blame = {})
      : Work(std::move(what), issuer),
        world_(std::move(world)),
        state_(std::move(state)),
        blame_(std::move(blame)) {}
  ~LocalWork() override;

 protected:
  bool poll() override;
  bool block_until(const Deadline& deadline) override;
  std::optional<std::string> on_timeout(std::chrono::milliseconds timeout) override;
  bool withdraw() override;

 private:
  bool finished_locked() const;  // with the world's mutex held; throws the op's error

  std::shared_ptr<World> world_;
  std::shared_ptr<OpState> state_;
  World::Blame blame_;
};

}  // namespace qmesh::local
