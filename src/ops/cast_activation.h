// The value a fused cast quantizes (CastActivation in ops/cast_job.h), one definition for the
// host (cpu/cast.cpp) and CUDA (cuda/cast.cu) backends so that their codes and amax agree bit
// for bit. A NaN result is the canonical NaN 0x7FFFFFFF on both (the device's arithmetic
// produces it, the host's would carry the input's payload), so the amax of a NaN is one value.
#pragma once

#include "cpu/gelu.h"
#include "ops/cast_job.h"

namespace qmesh::detail {

template <CastActivation kAct>
QMESH_HOST_DEVICE inline float activate(float x, [[maybe_unused]] float pre) {
  if constexpr (kAct == CastActivation::kNone) {
    return x;
  } else {
    return gelu_detail::canonical_nan(
        kAct == CastActivation::kGelu ? gelu(x) : gelu_detail::mul(x, dgelu(pre)));
  }
}

}  // namespace qmesh::detail
