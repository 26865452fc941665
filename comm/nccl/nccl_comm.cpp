// The NCCL communicator: stream-ordered collectives and point-to-point on CUDA buffers,
// works backed by CUDA events, bounded waits that abort the communicator on failure.
#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "check.h"
#include "qmesh/comm/nccl.h"
#include "qmesh/copy.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/logging.h"
#include "timeout_text.h"

namespace qmesh {
namespace {

// NCCL reduces these dtypes natively (bf16/fp16 accumulate in fp32 per step).
ncclDataType_t reduction_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kInt32:
      return ncclInt32;
    default:
      QMESH_THROW_KIND(ErrorKind::kUnsupported, "NCCL reductions do not take dtype ",
                       dtype_name(dtype));
  }
}

ncclRedOp_t reduction_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  QMESH_THROW("invalid ReduceOp value ", static_cast<int>(op));
}

// NCCL and CUDA calls act on the current device: DeviceGuard (qmesh/device.h) makes `device`
// current for a scope.

// An ncclComm_t shared by a communicator and its works, so that a wait can abort it.
class Handle {
 public:
  Handle(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  // Teardown as NCCL prescribes for a non-blocking communicator: ncclCommFinalize flushes
  // the operations already issued (returning ncclInProgress while it does), the wait for it
  // is bounded by comm_timeout(), then ncclCommDestroy frees it. A finalize that fails or
  // does not finish in time (a peer gone) aborts the communicator instead of hanging.
  ~Handle() {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    const DeviceGuard scope(device_, std::nothrow);
    ncclResult_t state = ncclCommFinalize(comm_);
    const Deadline deadline(comm_timeout());
    while (state == ncclInProgress && !deadline.passed()) {
      std::this_thread::yield();
      if (ncclCommGetAsyncError(comm_, &state) != ncclSuccess) state = ncclInternalError;
    }
    if (state != ncclSuccess) {
      QMESH_LOG_WARN("ncclCommFinalize ",
                     state == ncclInProgress ? "did not finish within QMESH_COMM_TIMEOUT_S"
                                             : ncclGetErrorString(state),
                     "; aborting the NCCL communicator");
      ncclCommAbort(comm_);
      return;
    }
    const ncclResult_t status = ncclCommDestroy(comm_);
    if (status != ncclSuccess) {
      QMESH_LOG_WARN("ncclCommDestroy failed: ", ncclGetErrorString(status));
    }
  }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;

  ncclComm_t comm() const { return comm_; }
  int device() const { return device_; }

  // Aborts the communicator (its kernels stop, its resources are freed); every later use
  // throws `reason`.
  void abort(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    if (aborted_) return;
    aborted_ = true;
    reason_ = reason;
    ncclCommAbort(comm_);
  }

  // The device, after checking that the communicator was not aborted.
  int usable_device() {
    std::lock_guard<std::mutex> lock(mu_);
    QMESH_CHECK(!aborted_, "the NCCL communicator was aborted (", reason_,
                "); create a new communicator");
    return device_;
  }

  // Throws (after aborting) if NCCL has reported an asynchronous error; returns whether
  // the communicator is still busy with non-blocking setup (ncclInProgress). Throws the
  // abort reason once the communicator was aborted (ncclCommAbort freed it: it must not be
  // queried again).
  bool poll_async(const std::string& what) {
    ncclResult_t state = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(mu_);
      QMESH_CHECK(!aborted_, what, ": the NCCL communicator was aborted (", reason_, ")");
      QMESH_CHECK_NCCL(ncclCommGetAsyncError(comm_, &state));
    }
    if (state == ncclSuccess) return false;
    if (state == ncclInProgress) return true;
    const std::string reason =
        detail::concat(what, " failed asynchronously: ", ncclGetErrorString(state), " (",
                       ncclGetLastError(comm_), ")");
    abort(reason);
    QMESH_THROW_KIND(ErrorKind::kRuntime, reason);
  }

  // Waits (bounded) until non-blocking setup of the last call has finished; `source` says
  // where the deadline's timeout was set.
  void settle(const std::string& what, const Deadline& deadline,
              TimeoutSource source = TimeoutSource::kEnvironment) {
    while (poll_async(what)) {
      if (deadline.passed()) {
        const std::string reason =
            detail::concat(what, " did not finish its setup in time; a peer may be missing (",
                           comm_detail::timeout_name(source), ")");
        abort(reason);
        QMESH_THROW_KIND(ErrorKind::kTimeout, reason);
      }
      std::this_thread::yield();
    }
  }

 private:
  ncclComm_t comm_;
  int device_;
  std::mutex mu_;
  bool aborted_ = false;
  std::string reason_;
};

// Completion of one enqueued operation: a CUDA event recorded on its stream.
class NcclWork : public Work {
 public:
  NcclWork(const Communicator& issuer, std::shared_ptr<Handle> handle, cudaStream_t stream,
           std::string what)
      : Work(std::move(what), issuer), handle_(std::move(handle)) {
    QMESH_CHECK_CUDA(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming));
    const cudaError_t status = cudaEventRecord(event_, stream);
    if (status != cudaSuccess) cudaEventDestroy(event_);
    QMESH_CHECK_CUDA(status);
  }

  // Does not block (work.h), so no drop_unfinished(): the operation stays ordered on its
  // stream, and a pending event is released by CUDA once it completes.
  ~NcclWork() override { cudaEventDestroy(event_); }

 protected:
  bool poll() override {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaSuccess) return true;
    if (status != cudaErrorNotReady) QMESH_CHECK_CUDA(status);
    handle_->poll_async(what());
    return false;
  }

  std::optional<std::string> on_timeout(std::chrono::milliseconds timeout) override {
    const std::string blame =
        "the NCCL communicator is aborted: a peer may have failed or not issued the matching "
        "call" +
        comm_detail::slow_job_hint(timeout_source());
    handle_->abort(timeout_text(timeout) + ": " + blame);
    return blame;
  }

 private:
  std::shared_ptr<Handle> handle_;
  cudaEvent_t event_ = nullptr;
};

constexpr int kMaxTag = 32767;

class NcclComm final : public Communicator {
 public:
  // `handle` must have finished its non-blocking setup (Handle::settle).
  explicit NcclComm(std::shared_ptr<Handle> handle) : handle_(std::move(handle)) {
    QMESH_CHECK_NCCL(ncclCommCount(comm(), &size_));
    QMESH_CHECK_NCCL(ncclCommUserRank(comm(), &rank_));
    DeviceGuard scope(handle_->device());
    QMESH_CHECK_CUDA(cudaStreamCreateWithFlags(&internal_, cudaStreamNonBlocking));
  }

  // A communicator over a new ncclComm_t once its setup has finished (bounded).
  static std::shared_ptr<NcclComm> settled(ncclComm_t comm, int device, const std::string& what,
                                           const Deadline& deadline,
                                           TimeoutSource source = TimeoutSource::kEnvironment) {
    auto handle = std::make_shared<Handle>(comm, device);
    handle->settle(what, deadline, source);
    return std::make_shared<NcclComm>(std::move(handle));
  }
  ~NcclComm() override { cudaStreamDestroy(internal_); }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend_name() const override { return "nccl"; }
  bool stream_ordered() const override { return true; }

  WorkHandle all_reduce_async(TensorView buf, ReduceOp op, Stream stream) override {
    comm_check::reducible(buf, "all_reduce buffer");
    require_on_device(buf, "all_reduce buffer");
    Launch launch(*this, stream, "nccl all_reduce");
    QMESH_CHECK_NCCL(ncclAllReduce(buf.data, buf.data, count(buf), reduction_type(buf.dtype),
                                   reduction_op(op), comm(), launch.stream));
    return launch.work();
  }

  WorkHandle all_gather_async(TensorView in, TensorView out, Stream stream) override {
    comm_check::all_gather_args(in, out, size_);
    require_on_device(in, "all_gather input");
    require_on_device(out, "all_gather output");
    Launch launch(*this, stream, "nccl all_gather");
    QMESH_CHECK_NCCL(
        ncclAllGather(in.data, out.data, in.nbytes(), ncclUint8, comm(), launch.stream));
    return launch.work();
  }

  WorkHandle reduce_scatter_async(TensorView in, TensorView out, ReduceOp op,
                                  Stream stream) override {
    comm_check::reduce_scatter_args(in, out, size_);
    require_on_device(in, "reduce_scatter input");
    require_on_device(out, "reduce_scatter output");
    Launch launch(*this, stream, "nccl reduce_scatter");
    QMESH_CHECK_NCCL(ncclReduceScatter(in.data, out.data, count(out), reduction_type(in.dtype),
                                       reduction_op(op), comm(), launch.stream));
    return launch.work();
  }

  WorkHandle broadcast_async(TensorView buf, int root, Stream stream) override {
    check_not_empty(buf, "broadcast buffer");
    require_on_device(buf, "broadcast buffer");
    comm_check::peer(root, size_, "broadcast root");
    Launch launch(*this, stream, "nccl broadcast");
    QMESH_CHECK_NCCL(
        ncclBroadcast(buf.data, buf.data, buf.nbytes(), ncclUint8, root, comm(), launch.stream));
    return launch.work();
  }

  // NCCL has no barrier: an all-reduce of one word on an internal stream.
  WorkHandle barrier_async() override {
    if (!scratch_.data()) scratch_ = Tensor(DType::kInt32, Shape{1}, device());
    return all_reduce_async(scratch_, ReduceOp::kSum, Stream{internal_});
  }

  WorkHandle send_async(TensorView in, int peer, int tag, Stream stream) override {
    check_p2p(in, peer, tag, "send");
    Launch launch(*this, stream, "nccl send");
    QMESH_CHECK_NCCL(ncclGroupStart());
    QMESH_CHECK_NCCL(ncclSend(in.data, in.nbytes(), ncclUint8, peer, comm(), launch.stream));
    QMESH_CHECK_NCCL(ncclGroupEnd());
    return launch.work();
  }

  WorkHandle recv_async(TensorView out, int peer, int tag, Stream stream) override {
    check_p2p(out, peer, tag, "receive");
    Launch launch(*this, stream, "nccl receive");
    QMESH_CHECK_NCCL(ncclGroupStart());
    QMESH_CHECK_NCCL(ncclRecv(out.data, out.nbytes(), ncclUint8, peer, comm(), launch.stream));
    QMESH_CHECK_NCCL(ncclGroupEnd());
    return launch.work();
  }

  int max_tag() const override { return kMaxTag; }

  std::shared_ptr<Communicator> split(int color, int key) override {
    DeviceGuard scope(handle_->usable_device());
    const Deadline deadline(timeout());
    // On the heap: NCCL's background job writes the new communicator after ncclCommSplit
    // returns; if settling times out, that write may still come, so the slot is leaked.
    auto child = std::make_unique<ncclComm_t>(nullptr);
    QMESH_CHECK_NCCL(
        ncclCommSplit(comm(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, child.get(), nullptr));
    try {
      handle_->settle("nccl split", deadline, timeout_source());
    } catch (...) {
      (void)child.release();
      throw;
    }
    if (*child == nullptr) return nullptr;
    auto part = settled(*child, handle_->device(), "nccl split (new communicator)", deadline,
                        timeout_source());
    with_my_timeout(part);
    return part;
  }

  // Host names travel as fixed-size records through an all-gather on the device.
  std::vector<int> host_ids() override {
    constexpr int64_t kWords = 64;  // 256 bytes, a host name's limit
    std::vector<int32_t> mine(kWords, 0);
    const std::string name = host_name();
    std::memcpy(mine.data(), name.data(), std::min(name.size(), sizeof(int32_t) * kWords - 1));
    Tensor in(DType::kInt32, Shape{kWords}, device());
    Tensor out(DType::kInt32, Shape{kWords * size_}, device());
    // On the internal stream: a blocking cudaMemcpy from pageable memory may return before
    // the data has landed, and the non-blocking internal stream would not wait for it.
    copy_bytes_async(in.data(), device(), mine.data(), Device::host(), in.nbytes(),
                     Stream{internal_});
    all_gather_async(in, out, Stream{internal_})->wait();
    std::vector<int32_t> all(kWords * size_);
    copy_bytes(all.data(), Device::host(), out.data(), device(), out.nbytes());
    std::vector<std::string> names;
    for (int r = 0; r < size_; ++r)
      names.emplace_back(reinterpret_cast<const char*>(&all[r * kWords]));
    return number_hosts(names);
  }

 private:
  // Enqueues one operation: checks the communicator, makes its device current, and after
  // the NCCL call settles non-blocking setup and records the work's event.
  struct Launch {
    Launch(NcclComm& comm_, Stream s, std::string what_)
        : comm(comm_),
          stream(static_cast<cudaStream_t>(s.handle)),
          what(std::move(what_)),
          scope(comm_.handle_->usable_device()) {}
    WorkHandle work() {
      comm.handle_->settle(what, Deadline(comm.timeout()), comm.timeout_source());
      return std::make_unique<NcclWork>(comm, comm.handle_, stream, what);
    }
    NcclComm& comm;
    cudaStream_t stream;
    std::string what;
    DeviceGuard scope;
  };

  static size_t count(const TensorView& t) { return static_cast<size_t>(t.numel()); }
  ncclComm_t comm() const { return handle_->comm(); }
  Device device() const { return Device::cuda(handle_->device()); }

  void require_on_device(const TensorView& t, std::string_view what) const {
    QMESH_CHECK(t.device == device(), what, " is on ", t.device.str(),
                "; this NCCL communicator carries buffers of ", device().str());
  }

  void check_p2p(const TensorView& t, int peer, int tag, std::string_view side) const {
    comm_check::message_args(t, peer, size_, tag, kMaxTag, side);
    require_on_device(t, detail::concat(side, " buffer"));
    QMESH_CHECK(peer != rank_, side, " peer ", peer,
                " is this rank: NCCL cannot send to itself outside a group (copy with "
                "cudaMemcpyAsync instead)");
  }

  std::shared_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
  cudaStream_t internal_ = nullptr;  // barrier and host_ids
  Tensor scratch_;                   // the barrier's word
};

}  // namespace

std::shared_ptr<Communicator> make_nccl_world(Bootstrap& bootstrap) {
  QMESH_CHECK(cuda_device_count() > 0,
              "the NCCL backend needs a CUDA device, and none is usable in this process");
  int device = 0;
  QMESH_CHECK_CUDA(cudaGetDevice(&device));
  ncclUniqueId id{};
  if (bootstrap.rank() == 0) QMESH_CHECK_NCCL(ncclGetUniqueId(&id));
  const std::string shared =
      bootstrap.broadcast(std::string(reinterpret_cast<const char*>(&id), sizeof(id)), 0);
  QMESH_CHECK(shared.size() == sizeof(id), "the bootstrap broadcast ", shared.size(),
              " bytes for the NCCL unique id; expected ", sizeof(id));
  std::memcpy(&id, shared.data(), sizeof(id));
  // Non-blocking, so that a missing peer makes initialization time out instead of hanging.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  QMESH_CHECK_NCCL(ncclCommInitRankConfig(&comm, bootstrap.size(), id, bootstrap.rank(), &config));
  return NcclComm::settled(comm, device, "nccl initialization", Deadline(comm_timeout()));
}

}  // namespace qmesh
