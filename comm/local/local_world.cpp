#include "local/local_world.h"

#include "qmesh/error.h"
#include "qmesh/logging.h"
#include "timeout_text.h"

namespace qmesh::local {

int World::new_contexts() {
  std::lock_guard lock(mu);
  return new_contexts_locked();
}

int World::new_contexts_locked() {
  const int ctx = next_context_;
  next_context_ += 2;
  return ctx;
}

void World::match(Posted& send, Posted& recv) {
  std::exception_ptr send_error, recv_error;
  try {
    QMESH_CHECK(send.bytes == recv.bytes, "message of ", send.bytes,
                " bytes arrived for a receive buffer of ", recv.bytes,
                " bytes: sender and receiver disagree on the size");
    comm_detail::copy_between(recv.buffer, send.buffer, send.bytes);
  } catch (const Error& e) {
    // Each side gets its own copy: the two ranks' threads rethrow, read and destroy their
    // exceptions independently (one shared object is a data race under ThreadSanitizer).
    send_error = std::current_exception();
    recv_error = std::make_exception_ptr(e);
  } catch (...) {
    send_error = recv_error = std::current_exception();
  }
  std::lock_guard lock(mu);
  send.state->error = send_error;
  recv.state->error = recv_error;
  for (auto* state : {send.state.get(), recv.state.get()}) state->done = true;
  cv.notify_all();
}

void World::post_send(int ctx, int src, int dst, int tag, Posted send) {
  std::unique_lock lock(mu);
  auto& waiting = recvs_[{ctx, src, dst, tag}];
  if (waiting.empty()) {
    sends_[{ctx, src, dst, tag}].push_back(std::move(send));
    return;
  }
  Posted recv = std::move(waiting.front());
  waiting.pop_front();
  lock.unlock();
  match(send, recv);
}

void World::post_recv(int ctx, int src, int dst, int tag, Posted recv) {
  std::unique_lock lock(mu);
  auto& waiting = sends_[{ctx, src, dst, tag}];
  if (waiting.empty()) {
    recvs_[{ctx, src, dst, tag}].push_back(std::move(recv));
    return;
  }
  Posted send = std::move(waiting.front());
  waiting.pop_front();
  lock.unlock();
  match(send, recv);
}

bool World::wait_until(std::unique_lock<std::mutex>& lock, const Deadline& deadline,
                       const std::function<bool()>& done, const std::string& what) {
  while (!done()) {
    if (aborted_) QMESH_THROW(what, " failed: the local world was aborted: ", abort_reason_);
    if (cv.wait_until(lock, deadline.at()) == std::cv_status::timeout && !done() && !aborted_)
      return false;
  }
  return true;
}

namespace {
// What follows "timed out after ...: " in a local timeout error.
std::string timeout_blame(const World::Blame& blame, TimeoutSource source) {
  std::string who = blame ? blame() : std::string();
  if (who.empty()) who = "a peer rank did not take part";
  return who + comm_detail::slow_job_hint(source);
}
}  // namespace

void World::wait(std::unique_lock<std::mutex>& lock, std::chrono::milliseconds timeout,
                 TimeoutSource source, const std::function<bool()>& done, const std::string& what,
                 const Blame& blame) {
  if (wait_until(lock, Deadline(timeout), done, what)) return;
  QMESH_THROW_KIND(ErrorKind::kTimeout, comm_detail::timeout_text(what, timeout, source), ": ",
                   timeout_blame(blame, source));
}

std::shared_ptr<const void> World::exchange(
    int ctx, uint64_t seq, int rank, int size, std::shared_ptr<const void> value,
    const std::function<std::shared_ptr<const void>(const Values&)>& finalize,
    std::chrono::milliseconds timeout, TimeoutSource source, const std::string& what,
    std::string_view op, const comm_detail::WorldRanks& world) {
  std::unique_lock lock(mu);
  Slot& slot = slots_[{ctx, seq}];
  if (slot.values.empty()) slot.values.resize(size);
  slot.values[rank] = std::move(value);
  if (++slot.arrived == size) {
    slot.result = finalize(slot.values);
    cv.notify_all();
  }
  wait(
      lock, timeout, source, [&] { return slot.arrived == size; }, what,
      [&] {
        std::vector<int> missing;
        for (int r = 0; r < size; ++r)
          if (!slot.values[r]) missing.push_back(r);
        return comm_detail::never_joined_text(missing, op, world);
      });
  std::shared_ptr<const void> result = slot.result;
  if (++slot.left == size) slots_.erase({ctx, seq});
  return result;
}

uint64_t World::join(int ctx, int rank, int size) {
  std::lock_guard lock(mu);
  auto& calls = joined_[ctx];
  calls.resize(size);
  return ++calls[rank];
}

std::vector<int> World::absent_locked(int ctx, uint64_t seq) const {
  std::vector<int> absent;
  const auto it = joined_.find(ctx);
  if (it == joined_.end()) return absent;
  for (size_t r = 0; r < it->second.size(); ++r)
    if (it->second[r] < seq) absent.push_back(static_cast<int>(r));
  return absent;
}

void World::abort(const std::string& reason) {
  std::lock_guard lock(mu);
  if (!aborted_) {
    aborted_ = true;
    abort_reason_ = reason;
  }
  cv.notify_all();
}

bool World::cancel_locked(const std::shared_ptr<OpState>& state, std::exception_ptr error) {
  for (auto* queues : {&sends_, &recvs_}) {
    for (auto& [key, queue] : *queues) {
      for (auto it = queue.begin(); it != queue.end(); ++it) {
        if (it->state != state) continue;
        queue.erase(it);
        state->error = std::move(error);
        state->done = true;
        return true;
      }
    }
  }
  return false;
}

// An unfinished send or receive is withdrawn, so that no later match writes into or reads
// from a buffer that may be gone; other work (a collective on the worker) is waited for. A
// collective whose wait timed out still runs on the worker with the caller's buffers until
// its own deadline (or the world's abort): it is waited for too, bounded by the timeout.
LocalWork::~LocalWork() {
  drop_unfinished();
  std::unique_lock lock(world_->mu);
  world_->cv.wait_until(lock, Deadline(timeout()).at(), [this] { return state_->done; });
}

bool LocalWork::finished_locked() const {
  if (state_->error) std::rethrow_exception(state_->error);
  return state_->done;
}

bool LocalWork::poll() {
  std::lock_guard lock(world_->mu);
  return finished_locked();
}

bool LocalWork::block_until(const Deadline& deadline) {
  std::unique_lock lock(world_->mu);
  try {
    world_->wait_until(
        lock, deadline, [this] { return state_->done; }, what());
  } catch (const Error&) {  // the world was aborted: a posted transfer is withdrawn
    world_->cancel_locked(state_, std::current_exception());
    throw;
  }
  return finished_locked();
}

std::optional<std::string> LocalWork::on_timeout(std::chrono::milliseconds) {
  std::lock_guard lock(world_->mu);
  if (finished_locked()) return std::nullopt;
  world_->cancel_locked(state_,
                        std::make_exception_ptr(
                            Error(ErrorKind::kTimeout, what() + " timed out", __FILE__, __LINE__)));
  return timeout_blame(blame_, timeout_source());
}

bool LocalWork::withdraw() {
  std::lock_guard lock(world_->mu);
  return state_->done ||
         world_->cancel_locked(
             state_, std::make_exception_ptr(Error(what() + " was dropped", __FILE__, __LINE__)));
}

}  // namespace qmesh::local
