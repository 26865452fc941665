// What the GPU tests of the casts share: the skip without a GPU, the bytes of a tensor on any
// device, inputs with special values mixed in, and the relative RMS error of GEMM results.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <vector>

#include "qmesh/copy.h"
#include "qmesh/device.h"
#include "qmesh/tensor.h"
#include "quant_test_util.h"

#define SKIP_WITHOUT_GPU() \
  if (::qmesh::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

namespace qmesh::test {

// sqrt(sum (got - want)^2 / sum want^2) over n values, in float64.
inline double relative_rms_error(const float* got, const float* want, size_t n) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < n; ++i) {
    err += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    norm += double(want[i]) * want[i];
  }
  return std::sqrt(err / norm);
}

inline std::vector<uint8_t> bytes_of(const TensorView& t) {
  std::vector<uint8_t> out(t.nbytes());
  copy_bytes(out.data(), Device::host(), t.data, t.device, t.nbytes());
  return out;
}

// Random values over many binades with zeros and huge and tiny values mixed in, and Inf and
// NaN if `nonfinite` (then only codes and scales compare bitwise: NaN payloads of sums and
// products differ between the backends).
inline Tensor special_input(DType dtype, const Shape& shape, uint32_t seed, bool nonfinite) {
  Tensor x = random_wide(dtype, shape, seed);
  const float specials[] = {0.0f,
                            -0.0f,
                            3e4f,
                            -1e-30f,
                            65504.0f,
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN()};
  const size_t kinds = nonfinite ? std::size(specials) : std::size(specials) - 2;
  for (int64_t i = 3; i < x.numel(); i += 2017) set_wide(x, i, specials[(i / 2017) % kinds]);
  return x;
}

}  // namespace qmesh::test
