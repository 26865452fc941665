// cuda_driver_check: says whether this machine's CUDA driver can run programs built with this
// CUDA toolkit, before anything else is tried (launch/gpu_check.sh's first step). Prints the
// CUDA version the driver supports (cudaDriverGetVersion), the runtime's
// (cudaRuntimeGetVersion), then the devices, or the CUDA error name and string.
// Exit status: 0 when the driver is new enough and at least one device is seen, 1 otherwise.
// Build: nvcc -o cuda_driver_check launch/cuda_driver_check.cpp
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>

namespace {

void print_version(const char* what, int v) {
  std::printf("%s CUDA %d.%d\n", what, v / 1000, (v % 1000) / 10);
}

int cuda_failure(const char* call, cudaError_t e) {
  std::printf("%s failed: %s (%s)\n", call, cudaGetErrorName(e), cudaGetErrorString(e));
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    std::printf(
        "Usage: cuda_driver_check\n"
        "Prints the CUDA version the driver supports and the one this program's runtime\n"
        "needs, then the CUDA devices. Exit status 0 when the driver is new enough and a\n"
        "device is seen, 1 otherwise (with the CUDA error name and string).\n");
    return help ? 0 : 1;
  }
  int driver = 0, runtime = 0;
  cudaError_t e = cudaRuntimeGetVersion(&runtime);
  if (e != cudaSuccess) return cuda_failure("cudaRuntimeGetVersion", e);
  print_version("runtime (this toolkit) needs", runtime);
  e = cudaDriverGetVersion(&driver);
  if (e != cudaSuccess) return cuda_failure("cudaDriverGetVersion", e);
  if (driver == 0) {
    std::printf("no CUDA driver is installed (libcuda.so was not found)\n");
    return 1;
  }
  print_version("driver supports up to", driver);
  if (driver < runtime) {
    std::printf(
        "the driver is too old for this toolkit: install a driver for CUDA %d.%d or newer, "
        "or build with a toolkit no newer than CUDA %d.%d\n",
        runtime / 1000, (runtime % 1000) / 10, driver / 1000, (driver % 1000) / 10);
    return 1;
  }
  int count = 0;
  e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return cuda_failure("cudaGetDeviceCount", e);
  std::printf("%d CUDA device(s)\n", count);
  for (int d = 0; d < count; ++d) {
    cudaDeviceProp prop{};
    e = cudaGetDeviceProperties(&prop, d);
    if (e != cudaSuccess) return cuda_failure("cudaGetDeviceProperties", e);
    std::printf("  %d: %s, compute capability %d.%d, %.1f GiB\n", d, prop.name, prop.major,
                prop.minor, double(prop.totalGlobalMem) / double(1 << 30));
  }
  return count > 0 ? 0 : 1;
}
