// The argument check of the casts' higher-precision tensors (internal to src/ops).
#pragma once

#include "qmesh/error.h"
#include "qmesh/tensor.h"

namespace qmesh::detail {

// Throws qmesh::Error naming `what` unless t is a non-empty fp32, bf16 or fp16 tensor.
inline void check_wide(const TensorView& t, const char* what) {
  check_not_empty(t, what);
  QMESH_CHECK(
      t.dtype == DType::kFloat32 || t.dtype == DType::kBFloat16 || t.dtype == DType::kFloat16, what,
      " must be fp32, bf16 or fp16, got ", dtype_name(t.dtype), "; convert it first");
}

}  // namespace qmesh::detail
