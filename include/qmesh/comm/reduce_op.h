// Reduction operators of all-reduce and reduce-scatter.
#pragma once

#include <string_view>

#include "qmesh/export.h"

namespace qmesh {

// Element-wise reduction. Reductions of bf16 and fp16 are computed in fp32 and rounded back
// to the 16-bit type once per combining step (so the result of a multi-step ring or tree
// may differ from a single fp32 reduction by a few units in the last place).
enum class ReduceOp { kSum, kMax, kMin };

// "sum", "max", "min".
QMESH_API std::string_view reduce_op_name(ReduceOp op);

}  // namespace qmesh
