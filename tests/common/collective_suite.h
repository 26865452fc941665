// Checks of every collective and of point-to-point against references computed here in
// float64 from each rank's known input. Every rank of a communicator calls the same check
// with the same arguments (from its thread in a local world, or its process under mpirun).
//
// Inputs are small multiples of 1/4 (integers for int32) so that every sum over <= 8 ranks
// is exact in bf16 and fp16 as well: the reference is exact and compared with ==.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "qmesh/comm/communicator.h"
#include "qmesh/float16.h"
#include "qmesh/tensor.h"

namespace qmesh::testing {

// Rank r's input element i (salt varies it between calls).
inline double input_value(int rank, int64_t i, int salt, DType dtype) {
  const int k = static_cast<int>((rank * 7 + i * 3 + salt) % 11) - 5;
  return dtype == DType::kInt32 ? k : k * 0.25;
}

inline void store(const Tensor& t, int64_t i, double v) {
  switch (t.dtype()) {
    case DType::kFloat32:
      t.data_as<float>()[i] = static_cast<float>(v);
      return;
    case DType::kFloat64:
      t.data_as<double>()[i] = v;
      return;
    case DType::kInt32:
      t.data_as<int32_t>()[i] = static_cast<int32_t>(v);
      return;
    case DType::kBFloat16:
      static_cast<uint16_t*>(t.data())[i] = float_to_bf16(static_cast<float>(v));
      return;
    case DType::kFloat16:
      static_cast<uint16_t*>(t.data())[i] = float_to_fp16(static_cast<float>(v));
      return;
    default:  // one-byte formats (fp8): the value's small integer as a byte pattern
      static_cast<uint8_t*>(t.data())[i] = static_cast<uint8_t>(static_cast<int>(v * 4) & 0xFF);
      return;
  }
}

inline double load(const Tensor& t, int64_t i) {
  switch (t.dtype()) {
    case DType::kFloat32:
      return t.data_as<float>()[i];
    case DType::kFloat64:
      return t.data_as<double>()[i];
    case DType::kInt32:
      return t.data_as<int32_t>()[i];
    case DType::kBFloat16:
      return bf16_to_float(static_cast<uint16_t*>(t.data())[i]);
    case DType::kFloat16:
      return fp16_to_float(static_cast<uint16_t*>(t.data())[i]);
    default:
      return static_cast<int8_t>(static_cast<uint8_t*>(t.data())[i]) / 4.0;
  }
}

inline Tensor make_input(DType dtype, int64_t n, int rank, int salt) {
  Tensor t(dtype, Shape{n});
  for (int64_t i = 0; i < n; ++i) store(t, i, input_value(rank, i, salt, dtype));
  return t;
}

inline double reference_reduce(int size, int64_t i, int salt, DType dtype, ReduceOp op) {
  double acc = input_value(0, i, salt, dtype);
  for (int r = 1; r < size; ++r) {
    const double v = input_value(r, i, salt, dtype);
    acc = op == ReduceOp::kSum   ? acc + v
          : op == ReduceOp::kMax ? std::max(acc, v)
                                 : std::min(acc, v);
  }
  return acc;
}

// Byte formats carry k/4 for k in [-5, 5] exactly as int8 (see store).
inline double roundtrip(double v, DType dtype) {
  return dtype_size(dtype) == 1 ? static_cast<int8_t>(static_cast<int>(v * 4) & 0xFF) / 4.0 : v;
}

inline void check_all_reduce(Communicator& comm, DType dtype, int64_t n, ReduceOp op) {
  Tensor buf = make_input(dtype, n, comm.rank(), 1);
  comm.all_reduce(buf, op);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(load(buf, i), reference_reduce(comm.size(), i, 1, dtype, op))
        << "all_reduce " << dtype_name(dtype) << " " << reduce_op_name(op) << " n=" << n
        << " element " << i << " on rank " << comm.rank() << " of " << comm.size();
  }
}

inline void check_reduce_scatter(Communicator& comm, DType dtype, int64_t n, ReduceOp op) {
  Tensor in = make_input(dtype, n * comm.size(), comm.rank(), 2);
  Tensor out(dtype, Shape{n});
  comm.reduce_scatter(in, out, op);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(load(out, i), reference_reduce(comm.size(), comm.rank() * n + i, 2, dtype, op))
        << "reduce_scatter " << dtype_name(dtype) << " n=" << n << " element " << i << " on rank "
        << comm.rank() << " of " << comm.size();
  }
}

inline void check_all_gather(Communicator& comm, DType dtype, int64_t n) {
  Tensor in = make_input(dtype, n, comm.rank(), 3);
  Tensor out(dtype, Shape{n * comm.size()});
  comm.all_gather(in, out);
  for (int r = 0; r < comm.size(); ++r) {
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(load(out, r * n + i), roundtrip(input_value(r, i, 3, dtype), dtype))
          << "all_gather " << dtype_name(dtype) << " n=" << n << " chunk " << r << " element " << i
          << " on rank " << comm.rank();
    }
  }
}

inline void check_broadcast(Communicator& comm, DType dtype, int64_t n, int root) {
  Tensor buf = make_input(dtype, n, comm.rank(), 4);
  comm.broadcast(buf, root);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(load(buf, i), roundtrip(input_value(root, i, 4, dtype), dtype))
        << "broadcast from " << root << " element " << i << " on rank " << comm.rank();
  }
}

// Every rank sends to every other rank with tag = sender, posting receives in reverse order
// of the sends so that matching by (peer, tag) is exercised.
inline void check_point_to_point(Communicator& comm, DType dtype, int64_t n) {
  const int size = comm.size();
  std::vector<Tensor> outs, ins;
  std::vector<WorkHandle> works;
  for (int p = size - 1; p >= 0; --p) {
    ins.push_back(Tensor(dtype, Shape{n}));
    works.push_back(comm.recv_async(ins.back(), p, p));
  }
  for (int p = 0; p < size; ++p) {
    outs.push_back(make_input(dtype, n, comm.rank() * 100 + p, 5));
    works.push_back(comm.send_async(outs.back(), p, comm.rank()));
  }
  for (auto& w : works) w->wait();
  for (int j = 0; j < size; ++j) {
    const int p = size - 1 - j;
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(load(ins[j], i), roundtrip(input_value(p * 100 + comm.rank(), i, 5, dtype), dtype))
          << "message from rank " << p << " element " << i << " on rank " << comm.rank();
    }
  }
}

// Ranks of even and odd old rank form two groups, each ordered by descending old rank.
inline void check_split(Communicator& comm) {
  auto sub = comm.split(comm.rank() % 2, -comm.rank());
  ASSERT_NE(sub, nullptr);
  const int members = (comm.size() - comm.rank() % 2 + 1) / 2;
  EXPECT_EQ(sub->size(), members);
  int higher = 0;  // same-colour ranks above this one come first
  for (int r = comm.rank() + 2; r < comm.size(); r += 2) ++higher;
  EXPECT_EQ(sub->rank(), higher);
  int32_t value = comm.rank();
  sub->all_reduce(TensorView(&value, DType::kInt32, Shape{1}), ReduceOp::kSum);
  int32_t expected = 0;
  for (int r = comm.rank() % 2; r < comm.size(); r += 2) expected += r;
  EXPECT_EQ(value, expected);
  // A negative colour leaves the rank out.
  auto none = comm.split(comm.rank() == 0 ? -1 : 0, 0);
  if (comm.rank() == 0) {
    EXPECT_EQ(none, nullptr);
  } else {
    ASSERT_NE(none, nullptr);
    EXPECT_EQ(none->size(), comm.size() - 1);
  }
}

// Several all-reduces in flight at once, of different sizes, waited for afterwards; every
// element is checked.
inline void check_overlapping_all_reduces(Communicator& comm, DType dtype) {
  std::vector<Tensor> bufs;
  std::vector<WorkHandle> works;
  for (int k = 0; k < 5; ++k) {
    bufs.push_back(make_input(dtype, 100 + 300 * k, comm.rank(), 1));
    works.push_back(comm.all_reduce_async(bufs.back(), ReduceOp::kSum));
  }
  for (auto& w : works) w->wait();
  for (size_t k = 0; k < bufs.size(); ++k) {
    EXPECT_TRUE(works[k]->test());
    for (int64_t i = 0; i < bufs[k].numel(); ++i) {
      ASSERT_EQ(load(bufs[k], i), reference_reduce(comm.size(), i, 1, dtype, ReduceOp::kSum))
          << "overlapping all_reduce " << k << " element " << i << " on rank " << comm.rank();
    }
  }
}

// The whole suite: every collective, several dtypes and sizes.
inline void run_collective_suite(Communicator& comm) {
  const DType reducible[] = {DType::kFloat32, DType::kFloat64, DType::kBFloat16, DType::kFloat16,
                             DType::kInt32};
  const int64_t sizes[] = {1, 3, 64, 1000, 4099};
  for (DType dtype : reducible) {
    for (int64_t n : sizes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        check_all_reduce(comm, dtype, n, op);
        check_reduce_scatter(comm, dtype, n, op);
      }
      check_all_gather(comm, dtype, n);
    }
  }
  for (int64_t n : sizes) check_all_gather(comm, DType::kFloat8E4M3, n);
  for (int root = 0; root < comm.size(); ++root) check_broadcast(comm, DType::kFloat32, 257, root);
  check_broadcast(comm, DType::kFloat8E5M2, 5, comm.size() - 1);
  check_point_to_point(comm, DType::kFloat32, 1000);
  check_point_to_point(comm, DType::kBFloat16, 7);
  comm.barrier();
  check_overlapping_all_reduces(comm, DType::kFloat32);
  check_overlapping_all_reduces(comm, DType::kBFloat16);
  check_split(comm);
}

}  // namespace qmesh::testing
