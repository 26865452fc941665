#include "qmesh/train/ordered_reduce.h"

#include <cstring>
#include <vector>

#include "qmesh/error.h"

namespace qmesh {

namespace {

void check_args(const TensorView& t, const char* what) {
  check_dtype(t, DType::kFloat32, what);
  QMESH_CHECK(t.device.is_host(), "ordered reductions run on host buffers; ", what, " is on ",
              t.device.str());
}

void wait_all(std::vector<WorkHandle>& works) {
  for (WorkHandle& w : works) w->wait();
  works.clear();
}

// Sums rank r's slice [begin[r], begin[r + 1]) of every rank's `data` into `out` (rank
// order), and exchanges the other ranks' slices of `data`. Empty slices send nothing.
void reduce_chunks(Communicator& comm, const float* data, const std::vector<int64_t>& begin,
                   float* out) {
  const int n = comm.size(), me = comm.rank();
  const int64_t mine = begin[me + 1] - begin[me];
  std::vector<float> received(size_t(mine) * size_t(n));
  std::vector<WorkHandle> works;
  if (mine > 0)
    for (int r = 0; r < n; ++r)
      if (r != me)
        works.push_back(
            comm.recv_async(TensorView(received.data() + r * mine, DType::kFloat32, Shape{mine}), r,
                            kOrderedReduceTag));
  for (int r = 0; r < n; ++r) {
    const int64_t count = begin[r + 1] - begin[r];
    if (r != me && count > 0)
      works.push_back(comm.send_async(
          TensorView(const_cast<float*>(data) + begin[r], DType::kFloat32, Shape{count}), r,
          kOrderedReduceTag));
  }
  if (mine > 0) std::memcpy(received.data() + me * mine, data + begin[me], size_t(mine) * 4);
  wait_all(works);
  for (int64_t i = 0; i < mine; ++i) {
    float sum = received[size_t(i)];
    for (int r = 1; r < n; ++r) sum += received[size_t(r * mine + i)];
    out[i] = sum;
  }
}

}  // namespace

void ordered_reduce_scatter(Communicator& comm, const TensorView& in, const TensorView& out) {
  check_args(in, "ordered_reduce_scatter input");
  check_args(out, "ordered_reduce_scatter output");
  comm_check::reduce_scatter_args(in, out, comm.size());
  std::vector<int64_t> begin(size_t(comm.size()) + 1);
  for (int r = 0; r <= comm.size(); ++r) begin[size_t(r)] = r * out.numel();
  reduce_chunks(comm, static_cast<const float*>(in.data), begin, static_cast<float*>(out.data));
}

void ordered_all_reduce(Communicator& comm, const TensorView& buf) {
  check_args(buf, "ordered_all_reduce buffer");
  const int n = comm.size(), me = comm.rank();
  const int64_t total = buf.numel();
  std::vector<int64_t> begin(size_t(n) + 1);
  for (int r = 0; r <= n; ++r) begin[size_t(r)] = total * r / n;
  float* data = static_cast<float*>(buf.data);
  std::vector<float> mine(size_t(begin[me + 1] - begin[me]));
  reduce_chunks(comm, data, begin, mine.data());
  std::memcpy(data + begin[me], mine.data(), mine.size() * 4);
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
