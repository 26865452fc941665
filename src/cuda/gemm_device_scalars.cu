// CUDA backend of the native NVFP4 GEMM's device scalars (ops/gemm_device_scalars.h);
// cpu/gemm_device_scalars.cpp is its host twin. One thread: two floats.
#include <cuda_runtime_api.h>

#include "cuda/gemm_device_scalars.h"
#include "ops/gemm_device_scalars_rule.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"

namespace qmesh::detail::cuda {

namespace {

__global__ void device_scalars_kernel(const float* a_scale_inv, const float* b_scale_inv,
                                      float alpha, float beta, float* out) {
  out[0] = folded_gemm_alpha(alpha, *a_scale_inv, *b_scale_inv);
  out[1] = beta;
}

}  // namespace

void write_gemm_device_scalars(int device, const float* a_scale_inv, const float* b_scale_inv,
                               float alpha, float beta, float* out, Stream stream) {
  const DeviceGuard guard(device);
  device_scalars_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream.handle)>>>(
      a_scale_inv, b_scale_inv, alpha, beta, out);
  QMESH_CHECK_CUDA(cudaGetLastError());
}

}  // namespace qmesh::detail::cuda
