// Matrix transpose, for any dtype (elements are moved, not converted): e.g. the columnwise
// copy of an FP8 operand that was gathered rowwise, which cuBLASLt's FP8 GEMMs (TN-only)
// need for the weight gradient.
#pragma once

#include "qmesh/export.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// out [cols, rows] = transpose of in, read as its row-major [rows, cols] view. Same dtype and
// device; out must not overlap in. Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void transpose(const TensorView& in, const TensorView& out, Stream stream = {});

}  // namespace qmesh
