// The float64 reference of a dense layer's forward and backward, from fp32 values (tests of
// the layers under the FP8 recipes).
#pragma once

#include <cstdint>
#include <vector>

namespace qmesh::test {

struct DenseReference {
  std::vector<double> y;   // [T, out] = x · Wᵀ + b
  std::vector<double> dx;  // [T, in]  = dy · W
  std::vector<double> dw;  // [out, in] = dyᵀ · x
  std::vector<double> db;  // [out]    = column sums of dy
};

// x [T, in], w [out, in], bias [out], dy [T, out], row-major.
inline DenseReference dense_reference(const float* x, const float* w, const float* bias,
                                      const float* dy, int64_t T, int64_t in, int64_t out) {
  DenseReference r{std::vector<double>(size_t(T * out)), std::vector<double>(size_t(T * in)),
                   std::vector<double>(size_t(out * in)), std::vector<double>(size_t(out))};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double s = bias[o];
      for (int64_t k = 0; k < in; ++k) s += double(x[t * in + k]) * w[o * in + k];
      r.y[size_t(t * out + o)] = s;
      r.db[size_t(o)] += dy[t * out + o];
      for (int64_t k = 0; k < in; ++k) {
        r.dx[size_t(t * in + k)] += double(dy[t * out + o]) * w[o * in + k];
        r.dw[size_t(o * in + k)] += double(dy[t * out + o]) * x[t * in + k];
      }
    }
  return r;
}

}  // namespace qmesh::test
