// Host element-wise reduction used by the ring algorithms and by backends that need a
// user-defined reduction (bf16/fp16 in MPI). Internal to qmesh's comm libraries (exported
// for the backend libraries, not installed as a public header).
#pragma once

#include <cstdint>

#include "qmesh/comm/reduce_op.h"
#include "qmesh/dtype.h"
#include "qmesh/export.h"

namespace qmesh::algorithms {

// acc[i] = op(acc[i], in[i]) for n elements of `dtype` (fp32, fp64, bf16, fp16, int32; Error
// otherwise). bf16/fp16 are combined in fp32 and rounded (nearest-even) once. Max and min
// propagate NaN; int32 sums wrap around (two's complement).
QMESH_API void reduce_into(void* acc, const void* in, int64_t n, DType dtype, ReduceOp op);

}  // namespace qmesh::algorithms
