// qmesh_tensor <-> qmesh::TensorView at the C API boundary.
#pragma once

#include "qmesh/c_api.h"
#include "qmesh/tensor.h"

namespace qmesh::capi {

// The view of a caller's tensor; Error naming `what` for a null pointer, a bad dtype,
// ndim or dimension, non-dense strides or a null data pointer.
TensorView to_view(const qmesh_tensor* tensor, const char* what);
// A qmesh_tensor describing a view that qmesh owns (strides NULL).
qmesh_tensor to_c(const TensorView& view);
Device to_device(const qmesh_device& device, const char* what);

}  // namespace qmesh::capi
