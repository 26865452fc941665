// Reuses a layer-owned activation tensor across steps, reallocating only when the shape or
// dtype changes.
#pragma once

#include "qmesh/tensor.h"

namespace qmesh {

inline TensorView ensure_tensor(Tensor& t, DType dtype, const Shape& shape, Device device) {
  if (t.data() == nullptr || t.dtype() != dtype || !(t.shape() == shape) || t.device() != device)
    t = Tensor(dtype, shape, device);
  return t.view();
}

}  // namespace qmesh
