#include "ops/gemm_device_scalars.h"

#include "cpu/gemm_device_scalars.h"
#include "cuda/gemm_device_scalars.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"

namespace qmesh::detail {

void write_gemm_device_scalars(const TensorView& a_scale_inv, const TensorView& b_scale_inv,
                               float alpha, float beta, const TensorView& out, Stream stream) {
  check_dtype(out, DType::kFloat32, "write_gemm_device_scalars output");
  check_shape(out, Shape{2}, "write_gemm_device_scalars output");
  check_dtype(a_scale_inv, DType::kFloat32, "write_gemm_device_scalars a_scale_inv");
  check_dtype(b_scale_inv, DType::kFloat32, "write_gemm_device_scalars b_scale_inv");
  check_shape(a_scale_inv, Shape{1}, "write_gemm_device_scalars a_scale_inv");
  check_shape(b_scale_inv, Shape{1}, "write_gemm_device_scalars b_scale_inv");
  check_device(a_scale_inv, out.device, "write_gemm_device_scalars a_scale_inv");
  check_device(b_scale_inv, out.device, "write_gemm_device_scalars b_scale_inv");
  const auto* a = static_cast<const float*>(a_scale_inv.data);
  const auto* b = static_cast<const float*>(b_scale_inv.data);
  auto* dst = static_cast<float*>(out.data);
  dispatch(
      out.device, [&] { cpu::write_gemm_device_scalars(a, b, alpha, beta, dst); },
      [&](auto index) { cuda::write_gemm_device_scalars(index, a, b, alpha, beta, dst, stream); });
}

}  // namespace qmesh::detail
