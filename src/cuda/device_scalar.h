// Checks a pointer to an fp32 scalar that a kernel or cuBLASLt reads or writes on the GPU:
// the FP8 scale, scale_inv and amax, which no TensorView describes (internal).
#pragma once

#include <string_view>

namespace qmesh::detail::cuda {

// Error unless `p` is null, or points to memory of CUDA device `device` or to managed memory.
// A host pointer there would fault the kernel instead: a sticky error that ends the process's
// use of the GPU. `what` names the pointer in the message.
void require_device_scalar(const void* p, int device, std::string_view what);

}  // namespace qmesh::detail::cuda
