#include "ops/scale_swizzle.h"

#include <cstdint>

#include "cpu/scale_swizzle.h"
#include "cuda/scale_swizzle.h"
#include "ops/scale_swizzle_layout.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"

namespace qmesh::detail {

Shape swizzled_scale_shape(int64_t rows, int64_t cols) {
  return Shape{round_up_to(rows, kScaleTileRows), round_up_to(cols, kScaleTileCols)};
}

void swizzle_block_scales(const TensorView& scales, const TensorView& out, Stream stream) {
  check_not_empty(scales, "swizzle_block_scales input");
  QMESH_CHECK(scales.dtype == DType::kFloat8E8M0 || scales.dtype == DType::kFloat8E4M3,
              "swizzle_block_scales takes fp8e8m0 (MXFP8) or fp8e4m3 (NVFP4) block scales, got ",
              dtype_name(scales.dtype));
  QMESH_CHECK(scales.shape.rank() == 2, "swizzle_block_scales input must be 2-D [rows, cols], got ",
              scales.shape.str());
  const int64_t rows = scales.shape.rows();
  const int64_t cols = scales.shape.cols();
  check_dtype(out, scales.dtype, "swizzle_block_scales output");
  check_device(out, scales.device, "swizzle_block_scales output");
  check_shape(out, swizzled_scale_shape(rows, cols), "swizzle_block_scales output");
  const auto* in = static_cast<const uint8_t*>(scales.data);
  auto* dst = static_cast<uint8_t*>(out.data);
  dispatch(
      scales.device, [&] { cpu::swizzle_block_scales(in, rows, cols, dst); },
      [&](auto index) { cuda::swizzle_block_scales(index, in, rows, cols, dst, stream); });
}

}  // namespace qmesh::detail
