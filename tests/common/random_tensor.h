// A host fp32 tensor of uniform random values, for tests of the layer ops.
#pragma once

#include <cstdint>
#include <random>

#include "qmesh/tensor.h"

namespace qmesh::test {

// Values uniform in [lo, hi) from std::mt19937(seed): the same on every platform.
inline Tensor random_tensor(const Shape& shape, uint32_t seed, float lo = -2.0f, float hi = 2.0f) {
  Tensor t(DType::kFloat32, shape);
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = dist(gen);
  return t;
}

}  // namespace qmesh::test
