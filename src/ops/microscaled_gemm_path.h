// Where a GEMM of microscaled operands (MXFP8; NVFP4) runs (docs/design/gemm.md "Native
// microscaled GEMMs"): natively (cuBLASLt's VEC32_UE8M0 / VEC16_UE4M3 block scale modes) on
// compute capability 10.0 and later, emulated elsewhere when asked, otherwise an Error.
#pragma once

#include <cstdint>
#include <string>

#include "qmesh/device.h"
#include "qmesh/export.h"

namespace qmesh::detail {

enum class MicroscaledGemmPath : uint8_t { kNative, kEmulated };

// What the choice knows of D's device.
struct MicroscaledGemmTarget {
  bool host = false;  // the host backend
  bool cuda = false;  // a CUDA device this build can use (false: built without CUDA)
  std::string name;   // "cpu", "cuda:0", or the CUDA device's name
  int major = 0;      // compute capability, CUDA only
  int minor = 0;
};

// The choice, a pure function: kNative on a CUDA target of compute capability >= 10.0
// (whatever `emulate` says: it asks for emulation only where there is no native GEMM);
// otherwise kEmulated when `emulate`; otherwise Error (ErrorKind::kUnsupported) naming the
// device, what it lacks and how to ask for emulation. `format` names the operands' format
// ("MXFP8", "NVFP4") in the message.
QMESH_API MicroscaledGemmPath choose_microscaled_gemm_path(const MicroscaledGemmTarget& target,
                                                           const char* format, bool emulate);

// The target of `device` (a CUDA device's name and capability are asked of the CUDA runtime
// once per device and process). Thread-safe.
QMESH_API MicroscaledGemmTarget microscaled_gemm_target(const Device& device);

}  // namespace qmesh::detail
