// The MPI backend: nonblocking MPI collectives and point-to-point on host buffers, each
// completed by polling MPI_Test against a deadline so that a dead or stuck peer turns into a
// qmesh::Error instead of a hang.
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "algorithms/reduce.h"
#include "failure.h"
#include "mpi/bounded_call.h"
#include "mpi/check.h"
#include "mpi/progress_thread.h"
#include "qmesh/comm/deadline.h"
#include "qmesh/comm/mpi.h"
#include "qmesh/logging.h"
#include "timeout_text.h"

namespace qmesh {

namespace mpi {
namespace {

// An MPI communicator handle and, once a wait on it has timed out, why it is unusable: the
// timed-out operation can be neither completed nor cancelled. `roll_tag` (above the users'
// tags) carries only the roll call that follows a timed-out collective.
struct CommState {
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0;
  int size = 1;
  int roll_tag = 0;
  std::vector<int> world_ranks;  // of this communicator's ranks (errors name both numberings)
  bool is_world = false;         // world_ranks[r] == r for all ranks of the world
  std::string broken;
  std::optional<std::string> roll_call;  // its finding, once held
  std::mutex mu;

  ~CommState() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
  // How errors name this communicator's ranks in MPI_COMM_WORLD: nothing for the world itself.
  const comm_detail::WorldRanks& naming() const {
    static const comm_detail::WorldRanks none;
    return is_world ? none : world_ranks;
  }

  void check_usable() {
    std::lock_guard lock(mu);
    QMESH_CHECK_KIND(ErrorKind::kRuntime, broken.empty(), "MPI communicator is unusable: ", broken);
  }
};

// Only when the whole job runs on one host (Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE equals
// OMPI_COMM_WORLD_SIZE) does a roll call (below) run: across hosts a roll-call message may need
// a new connection, and Open MPI's TCP transport aborts the process when that connection fails
// (a node whose link went down: tests/multinode), which would replace the error by an abort
// without a message.
bool single_host_job() {
  const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
  const char* world = std::getenv("OMPI_COMM_WORLD_SIZE");
  return local && world && std::string_view(local) == std::string_view(world);
}

// The top tag of `comm` (MPI_TAG_UB), kept for the roll call.
int top_tag(MPI_Comm comm) {
  int* tag_ub = nullptr;
  int found = 0;
  QMESH_CHECK_MPI(MPI_Comm_get_attr(comm, MPI_TAG_UB, &tag_ub, &found));
  return found ? *tag_ub : 32767;
}

// MPI cannot say which rank a timed-out collective waits for, so the ranks ask each other:
// each rank (`rank` of `size` in `comm`) whose collective `op` on `comm` timed out sends an
// empty message with `tag` to every peer, then collects the peers' messages for `grace`. A
// peer that is alive times out too (it waits in the same collective, or in one that waits
// for this rank) and answers; the ones that never answer are dead, frozen, or never joined.
// Returns the sentence naming them (roll_call_text; `naming` as there), or, in a job on
// several hosts, unnamed_peer_text without asking.
std::string roll_call(MPI_Comm comm, int rank, int size, int tag, std::string_view op,
                      std::chrono::milliseconds grace, const comm_detail::WorldRanks& naming) {
  if (!single_host_job()) return comm_detail::unnamed_peer_text(op);
  for (int peer = 0; peer < size; ++peer) {
    if (peer == rank) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    // Never waited for (the peer may be dead); an empty message needs no buffer.
    if (MPI_Isend(nullptr, 0, MPI_BYTE, peer, tag, comm, &request) == MPI_SUCCESS)
      MPI_Request_free(&request);
  }
  std::vector<bool> answered(static_cast<size_t>(size), false);
  answered[static_cast<size_t>(rank)] = true;
  int missing = size - 1;
  const Deadline deadline(grace);
  while (missing > 0 && !deadline.passed()) {
    int flag = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, tag, comm, &flag, &status) != MPI_SUCCESS) break;
    if (!flag) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, tag, comm, MPI_STATUS_IGNORE);
    if (!answered[static_cast<size_t>(status.MPI_SOURCE)]) --missing;
    answered[static_cast<size_t>(status.MPI_SOURCE)] = true;
  }
  std::vector<int> silent;
  for (int r = 0; r < size; ++r)
    if (!answered[static_cast<size_t>(r)]) silent.push_back(r);
  return comm_detail::roll_call_text(silent, op, naming);
}

// The roll call on a qmesh communicator: held once (later timeouts reuse the finding).
std::string roll_call(CommState& state, std::string_view op, std::chrono::milliseconds grace) {
  std::lock_guard lock(state.mu);
  if (!state.roll_call) {
    state.roll_call =
        roll_call(state.comm, state.rank, state.size, state.roll_tag, op, grace, state.naming());
  }
  return *state.roll_call;
}

// How long the roll call after a timeout of `timeout` collects answers: a quarter of it, at
// most 5 s, so that a rank still leaves well within 2 x the timeout. The survivors of a
// collective time out within moments of each other (they wait in the same one).
std::chrono::milliseconds roll_call_grace(std::chrono::milliseconds timeout) {
  return std::min(timeout / 4, std::chrono::milliseconds(5000));
}

class MpiWork : public Work {
 public:
  using OnDone = std::function<void(const MPI_Status&)>;
  // A receive is `cancellable`: on timeout or when dropped unfinished it is withdrawn with
  // MPI_Cancel and the communicator stays usable. Anything else that times out leaves the
  // communicator unusable. A timeout names the peer waited for: `blame` (point-to-point:
  // the peer and tag), or, when it is empty (a collective), the ranks that did not answer
  // the roll call after collective `op`.
  MpiWork(const Communicator& issuer, std::shared_ptr<CommState> comm, MPI_Request request,
          std::string what, std::string op, std::string blame, OnDone on_done = {},
          bool cancellable = false)
      : Work(std::move(what), issuer),
        comm_(std::move(comm)),
        request_(request),
        op_(std::move(op)),
        blame_(std::move(blame)),
        on_done_(std::move(on_done)),
        cancellable_(cancellable),
        progress_(ProgressThread::track()) {}

  ~MpiWork() override { drop_unfinished(); }

 protected:
  bool poll() override {
    int flag = 0;
    MPI_Status status;
    QMESH_CHECK_MPI(MPI_Test(&request_, &flag, &status));
    if (!flag) return false;
    progress_.release();
    if (on_done_) on_done_(status);
    return true;
  }

  bool withdraw() override { return try_cancel() != Cancel::kNotCancellable; }

  std::optional<std::string> on_timeout(std::chrono::milliseconds timeout) override {
    switch (try_cancel()) {
      case Cancel::kCancelled:
        return blame_ + "; the receive was withdrawn";
      case Cancel::kCompleted:
        return std::nullopt;  // the message arrived after all
      case Cancel::kNotCancellable:
        break;
    }
    const std::string blame =
        blame_.empty() ? roll_call(*comm_, op_, roll_call_grace(timeout)) : blame_;
    {
      std::lock_guard lock(comm_->mu);
      if (comm_->broken.empty()) comm_->broken = timeout_text(timeout) + ": " + blame;
    }
    comm_detail::record_failure();
    return blame + "; the communicator is now unusable and the process should exit";
  }

 private:
  enum class Cancel { kNotCancellable, kCancelled, kCompleted };
  // Withdraws an unmatched receive. A receive that was matched meanwhile completes instead,
  // normally at once; one matched by a peer that then died mid-transfer may never complete
  // (found by the fault campaign): after a second it counts as not cancellable.
  Cancel try_cancel() {
    if (!cancellable_) return Cancel::kNotCancellable;
    MPI_Status status;
    QMESH_CHECK_MPI(MPI_Cancel(&request_));
    const Deadline deadline(std::chrono::seconds(1));
    for (int finished = 0; !finished;) {
      QMESH_CHECK_MPI(MPI_Test(&request_, &finished, &status));
      if (!finished && deadline.passed()) return Cancel::kNotCancellable;
      if (!finished) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    progress_.release();
    int cancelled = 0;
    QMESH_CHECK_MPI(MPI_Test_cancelled(&status, &cancelled));
    if (cancelled) return Cancel::kCancelled;
    if (on_done_) on_done_(status);
    return Cancel::kCompleted;
  }

  std::shared_ptr<CommState> comm_;
  MPI_Request request_;
  std::string op_;
  std::string blame_;
  OnDone on_done_;
  bool cancellable_;
  ProgressThread::Active progress_;  // background progress while in flight
};

void require_host(const TensorView& t, std::string_view what) {
  QMESH_CHECK(t.device.is_host(), "the MPI backend carries host buffers; ", what, " is on ",
              t.device.str(), " (use the NCCL backend for device tensors)");
}

int count_of(int64_t n, std::string_view what) {
  QMESH_CHECK(n <= INT_MAX, what, " has ", n, " elements; MPI counts are limited to ", INT_MAX,
              " (split the transfer)");
  return static_cast<int>(n);
}

MPI_Datatype reduce_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    default:  // bf16, fp16: 16-bit words combined by a user-defined op
      return MPI_UINT16_T;
  }
}

template <DType D, ReduceOp O>
void user_reduce(void* in, void* inout, int* len, MPI_Datatype*) {
  algorithms::reduce_into(inout, in, *len, D, O);
}

template <DType D>
MPI_Op user_op(ReduceOp op) {
  // Created on first use (after MPI_Init) and kept for the life of the process.
  static const MPI_Op ops[3] = {[] {
                                  MPI_Op o;
                                  MPI_Op_create(&user_reduce<D, ReduceOp::kSum>, 1, &o);
                                  return o;
                                }(),
                                [] {
                                  MPI_Op o;
                                  MPI_Op_create(&user_reduce<D, ReduceOp::kMax>, 1, &o);
                                  return o;
                                }(),
                                [] {
                                  MPI_Op o;
                                  MPI_Op_create(&user_reduce<D, ReduceOp::kMin>, 1, &o);
                                  return o;
                                }()};
  return ops[static_cast<int>(op)];
}

MPI_Op reduce_op(DType dtype, ReduceOp op) {
  if (dtype == DType::kBFloat16) return user_op<DType::kBFloat16>(op);
  if (dtype == DType::kFloat16) return user_op<DType::kFloat16>(op);
  switch (op) {
    case ReduceOp::kSum:
      return MPI_SUM;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
  }
  QMESH_THROW("invalid ReduceOp value ", static_cast<int>(op));
}

class MpiComm : public Communicator {
 public:
  // Takes ownership of `comm`.
  explicit MpiComm(MPI_Comm comm) : state_(std::make_shared<CommState>()) {
    state_->comm = comm;
    QMESH_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
    QMESH_CHECK_MPI(MPI_Comm_rank(comm, &rank_));
    QMESH_CHECK_MPI(MPI_Comm_size(comm, &size_));
    state_->rank = rank_;
    state_->size = size_;
    state_->roll_tag = top_tag(comm);
    MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
    QMESH_CHECK_MPI(MPI_Comm_group(comm, &group));
    QMESH_CHECK_MPI(MPI_Comm_group(MPI_COMM_WORLD, &world_group));
    std::vector<int> ranks(static_cast<size_t>(size_));
    for (int r = 0; r < size_; ++r) ranks[static_cast<size_t>(r)] = r;
    state_->world_ranks.resize(ranks.size());
    QMESH_CHECK_MPI(MPI_Group_translate_ranks(group, size_, ranks.data(), world_group,
                                              state_->world_ranks.data()));
    MPI_Group_free(&group);
    MPI_Group_free(&world_group);
    int world_size = 0;
    QMESH_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
    state_->is_world = world_size == size_;
    for (int r = 0; r < size_; ++r)
      state_->is_world = state_->is_world && state_->world_ranks[static_cast<size_t>(r)] == r;
    max_tag_ = state_->roll_tag - 1;
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view backend_name() const override { return "mpi"; }
  int max_tag() const override { return max_tag_; }

  WorkHandle all_reduce_async(TensorView buf, ReduceOp op, Stream) override {
    comm_check::reducible(buf, "all_reduce buffer");
    require_host(buf, "the all_reduce buffer");
    return start("all_reduce", [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, buf.data, count_of(buf.numel(), "all_reduce buffer"),
                            reduce_type(buf.dtype), reduce_op(buf.dtype, op), comm(), r);
    });
  }

  WorkHandle all_gather_async(TensorView in, TensorView out, Stream) override {
    comm_check::all_gather_args(in, out, size_);
    require_host(in, "the all_gather input");
    require_host(out, "the all_gather output");
    const int bytes = count_of(static_cast<int64_t>(in.nbytes()), "all_gather input (bytes)");
    return start("all_gather", [&](MPI_Request* r) {
      return MPI_Iallgather(in.data, bytes, MPI_BYTE, out.data, bytes, MPI_BYTE, comm(), r);
    });
  }

  WorkHandle reduce_scatter_async(TensorView in, TensorView out, ReduceOp op, Stream) override {
    comm_check::reduce_scatter_args(in, out, size_);
    require_host(in, "the reduce_scatter input");
    require_host(out, "the reduce_scatter output");
    return start("reduce_scatter", [&](MPI_Request* r) {
      return MPI_Ireduce_scatter_block(in.data, out.data,
                                       count_of(out.numel(), "reduce_scatter output"),
                                       reduce_type(in.dtype), reduce_op(in.dtype, op), comm(), r);
    });
  }

  WorkHandle broadcast_async(TensorView buf, int root, Stream) override {
    check_not_empty(buf, "broadcast buffer");
    require_host(buf, "the broadcast buffer");
    comm_check::peer(root, size_, "broadcast root");
    return start("broadcast", [&](MPI_Request* r) {
      return MPI_Ibcast(buf.data, count_of(static_cast<int64_t>(buf.nbytes()), "broadcast (bytes)"),
                        MPI_BYTE, root, comm(), r);
    });
  }

  WorkHandle barrier_async() override {
    return start("barrier", [&](MPI_Request* r) { return MPI_Ibarrier(comm(), r); });
  }

  WorkHandle send_async(TensorView in, int peer, int tag, Stream) override {
    check_not_empty(in, "send buffer");
    require_host(in, "the send buffer");
    comm_check::peer(peer, size_, "send peer");
    comm_check::tag(tag, max_tag_);
    return start(
        detail::concat("send to rank ", peer, " tag ", tag),
        [&](MPI_Request* r) {
          return MPI_Isend(in.data, count_of(static_cast<int64_t>(in.nbytes()), "send (bytes)"),
                           MPI_BYTE, peer, tag, comm(), r);
        },
        comm_detail::p2p_wait_text(false, peer, tag, state_->naming()));
  }

  WorkHandle recv_async(TensorView out, int peer, int tag, Stream) override {
    check_not_empty(out, "receive buffer");
    require_host(out, "the receive buffer");
    comm_check::peer(peer, size_, "receive peer");
    comm_check::tag(tag, max_tag_);
    const int bytes = count_of(static_cast<int64_t>(out.nbytes()), "receive (bytes)");
    const std::string what = describe(detail::concat("receive from rank ", peer, " tag ", tag));
    auto check_count = [bytes, what](const MPI_Status& status) {
      int got = 0;
      QMESH_CHECK_MPI(MPI_Get_count(&status, MPI_BYTE, &got));
      QMESH_CHECK(got == bytes, what, " got a message of ", got, " bytes for a buffer of ", bytes,
                  " bytes: sender and receiver disagree on the size");
    };
    return start(
        detail::concat("receive from rank ", peer, " tag ", tag),
        [&](MPI_Request* r) { return MPI_Irecv(out.data, bytes, MPI_BYTE, peer, tag, comm(), r); },
        comm_detail::p2p_wait_text(true, peer, tag, state_->naming()), check_count, true);
  }

  std::shared_ptr<Communicator> split(int color, int key) override {
    // MPI_Comm_split has no nonblocking form: first make sure, with a bounded wait, that
    // every rank has arrived, so that the blocking call can hardly wait for a dead one; a
    // rank that dies or freezes just after the guard ends the process (bounded_call).
    const Deadline deadline(timeout());
    guard_all_arrived(deadline);
    MPI_Comm out = MPI_COMM_NULL;
    bounded_call("MPI_Comm_split", bounded_call_limit(), [&] {
      QMESH_CHECK_MPI(MPI_Comm_split(comm(), color < 0 ? MPI_UNDEFINED : color, key, &out));
    });
    if (out == MPI_COMM_NULL) return nullptr;
    return with_my_timeout(std::make_shared<MpiComm>(out));
  }

  std::vector<int> host_ids() override {
    const Deadline deadline(timeout());
    guard_all_arrived(deadline);
    MPI_Comm node = MPI_COMM_NULL;
    bounded_call("MPI_Comm_split_type", bounded_call_limit(), [&] {
      QMESH_CHECK_MPI(
          MPI_Comm_split_type(comm(), MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
    });
    auto node_comm = with_my_timeout(std::make_shared<MpiComm>(node));
    // A host is named by its lowest rank in this communicator.
    int32_t leader = rank_;
    TensorView leader_view(&leader, DType::kInt32, Shape{1});
    node_comm->all_reduce_async(leader_view, ReduceOp::kMin, {})->wait(deadline.left());
    std::vector<int32_t> leaders(size_);
    all_gather_async(leader_view, TensorView(leaders.data(), DType::kInt32, Shape{size_}), {})
        ->wait(deadline.left());
    std::vector<std::string> names;
    for (int32_t l : leaders) names.push_back(std::to_string(l));
    return number_hosts(names);
  }

 private:
  MPI_Comm comm() const { return state_->comm; }

  std::string describe(std::string_view op) const {
    return detail::concat("MPI ", op, " (rank ", rank_, " of ", size_, ")");
  }

  // Issues an operation; `blame` as in MpiWork (empty for collectives).
  template <class Issue>
  WorkHandle start(std::string_view op, Issue issue, std::string blame = {},
                   MpiWork::OnDone on_done = {}, bool cancellable = false) {
    state_->check_usable();
    MPI_Request request = MPI_REQUEST_NULL;
    const int code = issue(&request);
    if (code != MPI_SUCCESS) {
      throw Error(ErrorKind::kRuntime, describe(op) + " could not be started", __FILE__, __LINE__,
                  "", error_string(code));
    }
    return std::make_unique<MpiWork>(*this, state_, request, describe(op), std::string(op),
                                     std::move(blame), std::move(on_done), cancellable);
  }

  // Bounded wait until every rank has arrived, before a blocking MPI call.
  void guard_all_arrived(const Deadline& deadline) { barrier_async()->wait(deadline.left()); }

  std::shared_ptr<CommState> state_;
  int rank_ = 0;
  int size_ = 1;
  int max_tag_ = 32767;
};

}  // namespace
}  // namespace mpi

std::shared_ptr<Communicator> make_mpi_world() {
  int initialized = 0;
  QMESH_CHECK_MPI(MPI_Initialized(&initialized));
  QMESH_CHECK(initialized, "MPI is not initialized: create a qmesh::MpiSession first");
  // Nonblocking, so that a rank that died or froze before joining cannot keep the others
  // here forever (MPI_Comm_dup would).
  MPI_Comm dup = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  QMESH_CHECK_MPI(MPI_Comm_idup(MPI_COMM_WORLD, &dup, &request));
  const auto timeout = comm_timeout();
  const Deadline deadline(timeout);
  for (int done = 0;;) {
    QMESH_CHECK_MPI(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) break;
    if (deadline.passed()) {
      comm_detail::record_failure();
      // The roll call of a timed-out collective, over MPI_COMM_WORLD itself (point-to-point
      // works beside the unfinished duplicate): the ranks that never joined are named.
      int rank = 0, size = 1;
      QMESH_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
      QMESH_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
      const char* op = "duplicate of MPI_COMM_WORLD";
      QMESH_THROW_KIND(
          ErrorKind::kTimeout,
          comm_detail::timeout_text(
              detail::concat("MPI ", op, " in make_mpi_world (rank ", rank, " of ", size, ")"),
              timeout, TimeoutSource::kEnvironment),
          ": ",
          mpi::roll_call(MPI_COMM_WORLD, rank, size, mpi::top_tag(MPI_COMM_WORLD), op,
                         mpi::roll_call_grace(timeout), {}),
          "; MPI is now unusable and the process should exit");
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return std::make_shared<mpi::MpiComm>(dup);
}

std::unique_ptr<Bootstrap> make_mpi_bootstrap() { return make_comm_bootstrap(make_mpi_world()); }

}  // namespace qmesh
