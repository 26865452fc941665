// Elementwise sum of two tensors (the residual connection).
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// out[i] = a[i] + b[i]. a, b, out: fp32, one shape, one device; out may alias a or b. Host:
// blocking. CUDA: asynchronous on `stream`.
QMESH_API void add(const TensorView& a, const TensorView& b, const TensorView& out,
                   Stream stream = {});

}  // namespace qmesh
