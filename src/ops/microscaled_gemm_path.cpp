#include "ops/microscaled_gemm_path.h"

#include <map>
#include <mutex>

#include "cuda/device_arch.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"

namespace qmesh::detail {

namespace {

// Compute capability of the first GPUs with block-scaled (microscaling) tensor core GEMMs.
constexpr int kNativeMajor = 10;

std::string what_is_missing(const MicroscaledGemmTarget& t, const char* format) {
  if (t.host) return concat("the host backend has no native ", format, " GEMM");
  if (!t.cuda) return concat("qmesh was built without CUDA, so ", t.name, " is unusable");
  return concat(format, " GEMMs need compute capability ", kNativeMajor, ".0 (Blackwell); this is ",
                t.name, " (", t.major, ".", t.minor, ")");
}

}  // namespace

MicroscaledGemmPath choose_microscaled_gemm_path(const MicroscaledGemmTarget& target,
                                                 const char* format, bool emulate) {
  if (target.cuda && target.major >= kNativeMajor) return MicroscaledGemmPath::kNative;
  if (emulate) return MicroscaledGemmPath::kEmulated;
  QMESH_THROW_KIND(ErrorKind::kUnsupported, what_is_missing(target, format), ". Set ", format,
                   "BlockScaling(emulate=True) (C++: the recipe's `emulate`, or "
                   "GemmArgs::emulate_microscaled) or QMESH_BLOCK_EMULATION=1 to run them "
                   "emulated (dequantized, then a GEMM with fp32 accumulation)");
}

MicroscaledGemmTarget microscaled_gemm_target(const Device& device) {
  MicroscaledGemmTarget t;
  t.host = device.is_host();
  t.name = device.str();
  if (t.host) return t;
  on_cuda(device.index, [&](auto index) {
    require_device(device);
    // cudaGetDeviceProperties is slow, and every GEMM of microscaled operands asks.
    static std::mutex mutex;
    static std::map<int, MicroscaledGemmTarget> known;
    const std::lock_guard lock(mutex);
    auto it = known.find(index);
    if (it == known.end()) {
      const cuda::DeviceArch arch = cuda::device_arch(index);
      MicroscaledGemmTarget gpu;
      gpu.cuda = true;
      gpu.name = arch.name;
      gpu.major = arch.major;
      gpu.minor = arch.minor;
      it = known.emplace(index, gpu).first;
    }
    t = it->second;
  });
  return t;
}

}  // namespace qmesh::detail
