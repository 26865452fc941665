// An MXFP8 tensor (OCP Microscaling, the MXFP8BlockScaling recipe; docs/design/mxfp8.md):
// FP8 codes (E4M3 or E5M2) with one E8M0 scale per 32 consecutive elements of a row.
//
//   data      [R, C]      FP8 codes, row-major
//   scale     [R, C/32]   E8M0 bytes (DType::kFloat8E8M0): scale[r][k] is the scale of
//                         data[r, 32k : 32k + 32]
//   data_t    [C, R]      the columnwise copy: the transpose of x, quantized along its own rows
//                         (32x1 blocks of x)
//   scale_t   [C, R/32]   its E8M0 scales
//
// E8M0 byte b means 2^(b - 127); b = 0xFF is NaN. x[r, c] ~= code[r, c] * 2^(scale - 127).
// R and C must be multiples of 32 (kMxBlock): other sizes are refused, not padded. The
// scales are stored in this plain row-major layout; a GEMM that needs another layout (the
// swizzled tiles of cuBLASLt's VEC32_UE8M0 mode) rearranges them itself.
#pragma once

#include <cstdint>

#include "qmesh/export.h"
#include "qmesh/tensor.h"

namespace qmesh {

inline constexpr int64_t kMxBlock = 32;  // elements per E8M0 scale

// The value of an E8M0 byte: 2^(byte - 127) (byte 0 is 2^-127, a subnormal float), NaN for
// 0xFF. Exact.
QMESH_API float e8m0_to_float(uint8_t byte);
// The E8M0 byte of the scale of a block with amax `amax` whose elements are encoded with
// largest value `scaled_max` (> 0): amax / scaled_max (fp32) rounded up to a power of two,
// so that no element saturates (docs/design/mxfp8.md "Scale rule"). NaN amax -> 0xFF.
QMESH_API uint8_t e8m0_scale_for_amax(float amax, float scaled_max);

// Throws qmesh::Error unless rows and cols are positive multiples of kMxBlock; `what` names
// the tensor.
QMESH_API void check_mxfp8_shape(int64_t rows, int64_t cols, const char* what);

struct QMESH_API MxFp8TensorView {
  TensorView data;     // FP8 [rows, cols]
  TensorView scale;    // fp8e8m0 [rows, cols / 32]
  TensorView data_t;   // FP8 [cols, rows]; empty() when there is no columnwise copy
  TensorView scale_t;  // fp8e8m0 [cols, rows / 32]; with data_t

  DType dtype() const { return data.dtype; }
  Device device() const { return data.device; }
  bool has_columnwise() const { return !data_t.empty(); }
  // Throws qmesh::Error naming `what` unless the parts have the dtypes, shapes and device
  // above (data_t and scale_t both present or both empty).
  void validate(const char* what) const;
};

class QMESH_API MxFp8Tensor {
 public:
  MxFp8Tensor() = default;
  // Storage for a [rows, cols] MXFP8 tensor of FP8 dtype `fp8` on `device` (and the columnwise
  // copy if `columnwise`); codes 0, scales 127 (1.0).
  MxFp8Tensor(DType fp8, Shape shape, Device device, bool columnwise);

  // Error when empty() (default-constructed).
  MxFp8TensorView view() const;
  bool empty() const { return data_.data() == nullptr; }
  DType dtype() const { return data_.dtype(); }
  const Shape& shape() const { return data_.shape(); }
  Device device() const { return data_.device(); }
  bool has_columnwise() const { return data_t_.data() != nullptr; }

 private:
  Tensor data_, scale_, data_t_, scale_t_;
};

}  // namespace qmesh
