#include "engine.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "check.h"
#include "qmesh/comm/work.h"
#include "qmesh/error.h"
#include "qmesh/logging.h"
#include "qmesh/param.h"
#include "timeout_text.h"

namespace qmesh::ucx_detail {
namespace {

// Longest sleep of an idle progress thread between polls, in case a transport raises no
// wakeup event for some arrival.
QMESH_PARAM(idle_poll_ms, "UCX_IDLE_POLL_MS", 1)

// Waiters spin (progressing and yielding the core) for this long, then sleep in steps, so
// that oversubscribed ranks leave the cores to the others during long waits.
constexpr std::chrono::milliseconds kSpinTime{20};
constexpr std::chrono::microseconds kWaitSleep{50};

// "<what> failed in UCX [<status>]", e.g. a transfer to a peer that died: "ucx send of 4
// bytes from rank 3 to rank 0 (tag 7) failed in UCX [Connection reset by remote peer]".
Error ucx_error(const std::string& what, ucs_status_t status) {
  return Error(ErrorKind::kRuntime, detail::concat(what, " failed in UCX"), __FILE__, __LINE__, {},
               ucs_status_string(status));
}

// The user_data of a request: keeps its Op alive until the callback has run.
using Holder = std::shared_ptr<Op>;

// Finishes an Op after its request completed with `status`.
void finish(Op& op, ucs_status_t status) {
  if (status != UCS_OK) {
    op.complete(std::make_exception_ptr(ucx_error(op.what, status)));
  } else {
    op.complete();
  }
}

void on_send(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<Holder> holder(static_cast<Holder*>(user_data));
  finish(**holder, status);
  ucp_request_free(request);
}

void on_recv(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  std::unique_ptr<Holder> holder(static_cast<Holder*>(user_data));
  Op& op = **holder;
  if (status == UCS_ERR_MESSAGE_TRUNCATED ||
      (status == UCS_OK && info->length != op.expected_bytes)) {
    const std::string sent =
        status == UCS_OK ? detail::concat(info->length, " bytes") : std::string("more bytes");
    op.complete(std::make_exception_ptr(
        Error(detail::concat(op.what, ": the message has ", sent, " but the receive buffer has ",
                             op.expected_bytes, "; send and receive must have the same size"),
              __FILE__, __LINE__)));
  } else {
    finish(op, status);
  }
  ucp_request_free(request);
}

// Request parameters that always call `callback` (never complete immediately) with a new
// Holder of `op` as user data.
ucp_request_param_t callback_params(const std::shared_ptr<Op>& op) {
  ucp_request_param_t params{};
  params.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  params.cb.send = on_send;
  params.user_data = new Holder(op);
  return params;
}

// Checks what a *_nbx call returned when it was asked for a callback: an error pointer means
// the callback will not run, so its Holder is released here.
void check_posted(ucs_status_ptr_t request, const ucp_request_param_t& params,
                  const std::string& what) {
  if (UCS_PTR_IS_ERR(request)) {
    delete static_cast<Holder*>(params.user_data);
    throw ucx_error(what, UCS_PTR_STATUS(request));
  }
}

// The user data of an endpoint flush.
struct FlushTarget {
  Engine* engine;
  int peer;
};

void on_flush(void* request, ucs_status_t status, void* user_data) {
  std::unique_ptr<FlushTarget> target(static_cast<FlushTarget*>(user_data));
  Engine* engine = target->engine;
  const int peer = target->peer;
  engine->defer([engine, peer, status] { engine->flushed(peer, status); });
  ucp_request_free(request);
}

}  // namespace

void Op::complete(std::exception_ptr error_) {
  error = std::move(error_);
  done.store(true, std::memory_order_release);
}

Context::Context() {
  ucp_config_t* config = nullptr;
  QMESH_CHECK_UCX(ucp_config_read(nullptr, nullptr, &config));
  // UCX's cma transport aborts the process when the peer it copies from has died
  // (docs/reliability.md): unless the user chose the transports (UCX_TLS), all but cma.
  if (std::getenv("UCX_TLS") == nullptr) {
    const ucs_status_t modified = ucp_config_modify(config, "TLS", "^cma");
    if (modified != UCS_OK) ucp_config_release(config);
    QMESH_CHECK_UCX(modified);
  }
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;
  const ucs_status_t status = ucp_init(&params, config, &handle_);
  ucp_config_release(config);
  QMESH_CHECK_UCX(status);
}

Context::~Context() { ucp_cleanup(handle_); }

Engine::Engine(std::shared_ptr<Context> context)
    : context_(std::move(context)), idle_poll_ms_(static_cast<int>(idle_poll_ms())) {
  QMESH_CHECK(idle_poll_ms_ >= 1, "QMESH_UCX_IDLE_POLL_MS=", idle_poll_ms_,
              " must be at least 1 (milliseconds)");
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  params.thread_mode = UCS_THREAD_MODE_MULTI;
  QMESH_CHECK_UCX(ucp_worker_create(context_->handle(), &params, &worker_));
  try {
    ucp_worker_attr_t attr{};
    attr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE | UCP_WORKER_ATTR_FIELD_ADDRESS;
    QMESH_CHECK_UCX(ucp_worker_query(worker_, &attr));
    address_.assign(reinterpret_cast<const char*>(attr.address), attr.address_length);
    ucp_worker_release_address(worker_, attr.address);
    QMESH_CHECK(attr.thread_mode == UCS_THREAD_MODE_MULTI,
                "the UCX library does not support multi-threaded workers (it was built "
                "without --enable-mt); the UCX backend needs them for its progress thread");
    int event_fd = -1;
    QMESH_CHECK_UCX(ucp_worker_get_efd(worker_, &event_fd));
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    QMESH_CHECK(epoll_fd_ >= 0, "epoll_create1 failed: ", std::strerror(errno));
    epoll_event event{};
    event.events = EPOLLIN;
    QMESH_CHECK(epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd, &event) == 0,
                "epoll_ctl on the UCX worker's event fd failed: ", std::strerror(errno));
  } catch (...) {
    if (epoll_fd_ >= 0) close(epoll_fd_);
    ucp_worker_destroy(worker_);
    throw;
  }
  progress_thread_ = std::thread([this] { progress_loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    stop_ = true;
  }
  ucp_worker_signal(worker_);
  progress_thread_.join();  // after it has run the jobs still queued
  // The endpoints go with the worker. They are not closed one by one first: a flush-mode
  // close needs the peer's worker, which a peer that destroyed its communicator no longer
  // has (the close then fails after a transport timeout), and a forced close needs
  // peer-failure handling, which the shared-memory transports lack.
  close(epoll_fd_);
  ucp_worker_destroy(worker_);
}

void Engine::connect(const std::vector<std::string>& addresses) {
  QMESH_CHECK(endpoints_.empty(), "UCX endpoints are already connected");
  for (const std::string& address : addresses) {
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    params.address = reinterpret_cast<const ucp_address_t*>(address.data());
    ucp_ep_h ep = nullptr;
    const ucs_status_t status = ucp_ep_create(worker_, &params, &ep);
    if (status != UCS_OK) {  // e.g. the peer died after it published its address
      throw Error(ErrorKind::kRuntime, "UCX call failed", __FILE__, __LINE__,
                  detail::concat("ucp_ep_create to ",
                                 comm_detail::peer_ranks({static_cast<int>(endpoints_.size())}),
                                 " (did it die or leave?)"),
                  ucs_status_string(status));
    }
    endpoints_.push_back(ep);
    std::lock_guard<std::mutex> lock(flush_mu_);
    flush_queues_.emplace_back();
  }
}

std::shared_ptr<Op> Engine::tag_send(int peer, const void* data, size_t bytes, ucp_tag_t tag,
                                     std::string what) {
  auto op = std::make_shared<Op>(std::move(what));
  ucp_request_param_t params = callback_params(op);
  check_posted(ucp_tag_send_nbx(endpoint(peer), data, bytes, tag, &params), params, op->what);
  return op;
}

std::shared_ptr<Op> Engine::tag_recv(void* data, size_t bytes, ucp_tag_t tag, std::string what) {
  auto op = std::make_shared<Op>(std::move(what));
  op->expected_bytes = bytes;
  ucp_request_param_t params = callback_params(op);
  params.cb.recv = on_recv;
  check_posted(ucp_tag_recv_nbx(worker_, data, bytes, tag, ~ucp_tag_t{0}, &params), params,
               op->what);
  return op;
}

std::shared_ptr<Op> Engine::put_signal(int peer, const RemoteRegion& remote, size_t offset,
                                       const void* data, size_t bytes, std::string what) {
  auto op = std::make_shared<Op>(std::move(what));
  ucp_ep_h ep = endpoint(peer);
  // Step 3 (deferred after the flush): the signal. A fetching add, so that its completion
  // means it has executed at the peer.
  op->next = [op, ep, remote]() {
    try {
      ucp_request_param_t params = callback_params(op);
      params.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE | UCP_OP_ATTR_FIELD_REPLY_BUFFER;
      params.datatype = ucp_dt_make_contig(sizeof(uint64_t));
      params.reply_buffer = &op->reply;
      check_posted(ucp_atomic_op_nbx(ep, UCP_ATOMIC_OP_ADD, &op->operand, 1, remote.counter_address,
                                     remote.counter_rkey, &params),
                   params, op->what + " (completion signal)");
    } catch (...) {
      op->complete(std::current_exception());
    }
  };
  // Step 1: the data. Its own request is not tracked: the flush covers it.
  ucp_request_param_t put_params{};
  ucs_status_ptr_t put =
      ucp_put_nbx(ep, data, bytes, remote.data_address + offset, remote.data_rkey, &put_params);
  if (UCS_PTR_IS_ERR(put)) throw ucx_error(op->what, UCS_PTR_STATUS(put));
  if (put != nullptr) ucp_request_free(put);
  // Step 2: an endpoint flush; its completion means the data is in the peer's memory.
  std::lock_guard<std::mutex> lock(flush_mu_);
  FlushQueue& queue = flush_queues_.at(static_cast<size_t>(peer));
  queue.waiting.push_back(op);
  if (!queue.in_flight) start_flush(peer);
  return op;
}

void Engine::start_flush(int peer) {
  FlushQueue& queue = flush_queues_[static_cast<size_t>(peer)];
  queue.covered.swap(queue.waiting);
  queue.in_flight = true;
  ucp_request_param_t params{};
  params.op_attr_mask =
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  params.cb.send = on_flush;
  params.user_data = new FlushTarget{this, peer};
  ucs_status_ptr_t request = ucp_ep_flush_nbx(endpoint(peer), &params);
  if (request == nullptr) {
    // Already flushed (every put to the peer was acknowledged before the flush started):
    // UCX returns UCS_OK at once and never calls the callback, UCP_OP_ATTR_FLAG_NO_IMM_CMPL
    // notwithstanding. Completing the flush here is what keeps the queue going.
    delete static_cast<FlushTarget*>(params.user_data);
    defer([this, peer] { flushed(peer, UCS_OK); });
  } else if (UCS_PTR_IS_ERR(request)) {
    delete static_cast<FlushTarget*>(params.user_data);
    for (auto& op : queue.covered) {
      op->complete(
          std::make_exception_ptr(ucx_error(op->what + " (flush)", UCS_PTR_STATUS(request))));
    }
    queue.covered.clear();
    queue.in_flight = false;
  }
}

void Engine::flushed(int peer, ucs_status_t status) {
  std::vector<std::shared_ptr<Op>> batch;
  {
    std::lock_guard<std::mutex> lock(flush_mu_);
    FlushQueue& queue = flush_queues_[static_cast<size_t>(peer)];
    batch.swap(queue.covered);
    queue.in_flight = false;
    if (!queue.waiting.empty()) start_flush(peer);
  }
  for (auto& op : batch) {
    if (status != UCS_OK) {
      op->complete(std::make_exception_ptr(ucx_error(op->what + " (flush)", status)));
      continue;
    }
    std::function<void()> next = std::move(op->next);
    op->next = nullptr;
    next();
  }
}

void Engine::submit(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    jobs_.push_back(std::move(job));
  }
  ucp_worker_signal(worker_);  // wakes the progress thread from its epoll sleep
}

void Engine::defer(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(deferred_mu_);
  deferred_.push_back(std::move(fn));
}

unsigned Engine::progress() {
  const unsigned events = ucp_worker_progress(worker_);
  std::vector<std::function<void()>> steps;
  {
    std::lock_guard<std::mutex> lock(deferred_mu_);
    steps.swap(deferred_);
  }
  for (auto& step : steps) step();
  return events + static_cast<unsigned>(steps.size());
}

bool Engine::wait_until(const std::function<bool()>& done, const Deadline& deadline) {
  const Clock::time_point spin_until = Clock::now() + kSpinTime;
  while (!done()) {
    if (deadline.passed()) return false;
    if (progress() > 0) continue;
    if (Clock::now() < spin_until) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kWaitSleep);
    }
  }
  return true;
}

void Engine::progress_loop() {
  bool warned = false;
  for (;;) {
    std::function<void()> job;
    {
      std::lock_guard<std::mutex> lock(jobs_mu_);
      if (!jobs_.empty()) {
        job = std::move(jobs_.front());
        jobs_.pop_front();
      } else if (stop_) {
        return;
      }
    }
    if (job) {
      job();
      continue;
    }
    if (progress() > 0) continue;
    const ucs_status_t status = ucp_worker_arm(worker_);
    if (status == UCS_ERR_BUSY) continue;  // events arrived meanwhile: progress again
    if (status != UCS_OK && !warned) {
      QMESH_LOG_WARN("ucp_worker_arm failed (", ucs_status_string(status),
                     "); the UCX progress thread polls every ", idle_poll_ms_, " ms instead");
      warned = true;
    }
    epoll_event event{};
    epoll_wait(epoll_fd_, &event, 1, idle_poll_ms_);
  }
}

}  // namespace qmesh::ucx_detail
