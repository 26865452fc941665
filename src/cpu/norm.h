// The CPU backend of norm_forward (cpu/norm.cpp); arguments are checked by the caller.
#pragma once

#include "ops/norm_job.h"

namespace qmesh::detail::cpu {

void norm_forward(const NormJob& job);

}  // namespace qmesh::detail::cpu
