// Builds a layer parameter on its device from initial values drawn on the host, so that host
// and CUDA runs start from the same bits (internal).
#pragma once

#include <algorithm>
#include <string>
#include <utility>

#include "qmesh/copy.h"
#include "qmesh/layers/parameter.h"

namespace qmesh {

// value: the fp32 host tensor of initial values (moved, or copied to `device`); the gradient
// starts at zero. Blocking.
inline Parameter make_parameter(std::string name, Tensor value, Device device) {
  Tensor zeros(DType::kFloat32, value.shape());
  std::fill_n(zeros.data_as<float>(), zeros.numel(), 0.0f);
  if (device.is_host()) return {std::move(name), std::move(value), std::move(zeros)};
  return {std::move(name), clone(value, device), clone(zeros, device)};
}

}  // namespace qmesh
