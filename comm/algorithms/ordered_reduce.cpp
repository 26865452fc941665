#include "qmesh/comm/ordered_reduce.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "qmesh/comm/composite_work.h"
#include "qmesh/error.h"

namespace qmesh {

namespace {

void check_args(const TensorView& t, const char* what) {
  check_dtype(t, DType::kFloat32, what);
  QMESH_CHECK(t.device.is_host(), "ordered reductions run on host buffers; ", what, " is on ",
              t.device.str());
}

// Each with its communicator's timeout.
void wait_all(std::vector<WorkHandle>& works) {
  for (WorkHandle& w : works) w->wait();
  works.clear();
}

// Sums rank r's slice [begin[r], begin[r + 1]) of every rank's `data` into `out` (rank
// order), and exchanges the other ranks' slices of `data`. Empty slices send nothing. The
// transfers (its parts) start at construction; the sum is taken once they are all complete.
class ChunkReduction : public CompositeWork {
 public:
  ChunkReduction(Communicator& comm, const float* data, const std::vector<int64_t>& begin,
                 float* out)
      : CompositeWork(
            detail::concat("rank-ordered reduction (rank ", comm.rank(), " of ", comm.size(), ")"),
            comm),
        n_(comm.size()),
        mine_(begin[size_t(comm.rank()) + 1] - begin[size_t(comm.rank())]),
        out_(out) {
    const int me = comm.rank();
    if (mine_ > 0) {
      received_ = keep(Tensor(DType::kFloat32, Shape{mine_ * n_})).data_as<float>();
      for (int r = 0; r < n_; ++r)
        if (r != me)
          add(comm.recv_async(TensorView(received_ + r * mine_, DType::kFloat32, Shape{mine_}), r,
                              kOrderedReduceTag));
    }
    for (int r = 0; r < n_; ++r) {
      const int64_t count = begin[size_t(r) + 1] - begin[size_t(r)];
      if (r != me && count > 0)
        add(comm.send_async(
            TensorView(const_cast<float*>(data) + begin[size_t(r)], DType::kFloat32, Shape{count}),
            r, kOrderedReduceTag));
    }
    if (mine_ > 0) std::memcpy(received_ + me * mine_, data + begin[size_t(me)], size_t(mine_) * 4);
  }

 protected:
  void next_stage() override {
    for (int64_t i = 0; i < mine_; ++i) {
      float sum = received_[i];
      for (int r = 1; r < n_; ++r) sum += received_[r * mine_ + i];
      out_[i] = sum;
    }
  }

 private:
  int n_;
  int64_t mine_;
  float* out_;
  float* received_ = nullptr;  // kept by the composite: [n_, mine_]
};

}  // namespace

WorkHandle ordered_reduce_scatter_async(Communicator& comm, const TensorView& in,
                                        const TensorView& out) {
  check_args(in, "ordered_reduce_scatter input");
  check_args(out, "ordered_reduce_scatter output");
  comm_check::reduce_scatter_args(in, out, comm.size());
  std::vector<int64_t> begin(size_t(comm.size()) + 1);
  for (int r = 0; r <= comm.size(); ++r) begin[size_t(r)] = r * out.numel();
  return std::make_unique<ChunkReduction>(comm, static_cast<const float*>(in.data), begin,
                                          static_cast<float*>(out.data));
}

void ordered_reduce_scatter(Communicator& comm, const TensorView& in, const TensorView& out) {
  ordered_reduce_scatter_async(comm, in, out)->wait();
}

void ordered_all_reduce(Communicator& comm, const TensorView& buf) {
  check_args(buf, "ordered_all_reduce buffer");
  const int n = comm.size(), me = comm.rank();
  const int64_t total = buf.numel();
  std::vector<int64_t> begin(size_t(n) + 1);
  for (int r = 0; r <= n; ++r) begin[size_t(r)] = total * r / n;
  float* data = static_cast<float*>(buf.data);
  std::vector<float> mine(size_t(begin[me + 1] - begin[me]));
  ChunkReduction(comm, data, begin, mine.data()).wait();
  if (!mine.empty()) std::memcpy(data + begin[me], mine.data(), mine.size() * sizeof(float));
  // Every rank sends its summed chunk to every other (all-gather).
  std::vector<WorkHandle> works;
  for (int r = 0; r < n; ++r) {
    const int64_t count = begin[r + 1] - begin[r];
    if (r == me || count == 0) continue;
    works.push_back(comm.recv_async(TensorView(data + begin[r], DType::kFloat32, Shape{count}), r,
                                    kOrderedReduceTag + 1));
  }
  for (int r = 0; r < n && !mine.empty(); ++r)
    if (r != me)
      works.push_back(comm.send_async(
          TensorView(data + begin[me], DType::kFloat32, Shape{int64_t(mine.size())}), r,
          kOrderedReduceTag + 1));
  wait_all(works);
}

}  // namespace qmesh
