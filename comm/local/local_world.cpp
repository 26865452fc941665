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

void World::wait(std::unique_lock<std::mutex>& lock, Clock::time_point deadline,
                 const std::function<bool()>& done, const std::string& what, const Blame& blame) {
  const auto start = Clock::now();
  while (!done()) {
    if (aborted_) QMESH_THROW(what, " failed: the local world was aborted: ", abort_reason_);
    if (cv.wait_until(lock, deadline) == std::cv_status::timeout && !done()) {
      if (aborted_) continue;
      std::string who = blame ? blame() : std::string();
      if (who.empty()) who = "a peer rank did not take part";
      QMESH_THROW(comm_detail::timeout_text(
                      what, std::chrono::ceil<std::chrono::milliseconds>(Clock::now() - start)),
                  ": ", who, " (raise QMESH_COMM_TIMEOUT_S if it is just slow)");
    }
  }
}

std::shared_ptr<const void> World::exchange(
    int ctx, uint64_t seq, int rank, int size, std::shared_ptr<const void> value,
    const std::function<std::shared_ptr<const void>(const Values&)>& finalize,
    Clock::time_point deadline, const std::string& what, std::string_view op) {
  std::unique_lock lock(mu);
  Slot& slot = slots_[{ctx, seq}];
  if (slot.values.empty()) slot.values.resize(size);
  slot.values[rank] = std::move(value);
  if (++slot.arrived == size) {
    slot.result = finalize(slot.values);
    cv.notify_all();
  }
  wait(
      lock, deadline, [&] { return slot.arrived == size; }, what,
      [&] {
        std::vector<int> missing;
        for (int r = 0; r < size; ++r)
          if (!slot.values[r]) missing.push_back(r);
        return comm_detail::never_joined_text(missing, op);
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
// from a buffer that may be gone; other work (a collective on the worker) is waited for.
LocalWork::~LocalWork() {
  {
    std::lock_guard lock(world_->mu);
    if (state_->done) return;
    if (world_->cancel_locked(
            state_, std::make_exception_ptr(Error(what_ + " was dropped", __FILE__, __LINE__))))
      return;
  }
  const bool reported = failure_reported_;
  try {
    wait();
  } catch (const std::exception& e) {
    if (!reported) QMESH_LOG_ERROR("unfinished ", what_, " dropped: ", e.what());
  }
}

bool LocalWork::test() {
  std::lock_guard lock(world_->mu);
  if (state_->error) {
    failure_reported_ = true;
    std::rethrow_exception(state_->error);
  }
  return state_->done;
}

void LocalWork::wait(std::chrono::milliseconds timeout) {
  {
    std::unique_lock lock(world_->mu);
    try {
      world_->wait(
          lock, Clock::now() + timeout, [this] { return state_->done; }, what_, blame_);
    } catch (const Error&) {
      failure_reported_ = true;
      world_->cancel_locked(state_, std::current_exception());
      throw;
    }
  }
  test();
}

}  // namespace qmesh::local
