// A quantized (FP8) tensor as the GEMMs consume it (TransformerEngine's representation):
//   data        rowwise FP8 codes, shape [rows, cols] (row-major);
//   data_t      optional columnwise copy: the transpose, shape [cols, rows], made by the
//               fused cast_transpose so that Hopper's TN-only FP8 GEMM needs no extra pass;
//   scale       fp32 scalar: q = sat_rne(x * scale);
//   scale_inv   fp32 scalar, 1 / scale: x ~= q * scale_inv (cuBLASLt's A/B_SCALE_POINTER);
//   amax        fp32 scalar: max |x| of the unscaled inputs quantized into it since it was last
//               reset (a running max; see ops/quantize.h).
// The scalars live on the same device as the data, so GPU kernels and cuBLASLt read them
// without a host round trip. A QuantizedTensor keeps each in its own 16-byte slot: cuBLASLt
// launches FP8 GEMMs only on 16-byte-aligned scale pointers (a view's misaligned scalars still
// work: the GEMM stages them, at the cost of two small copies per launch).
#pragma once

#include "qmesh/export.h"
#include "qmesh/tensor.h"

namespace qmesh {

struct QMESH_API QuantizedTensorView {
  TensorView data;    // FP8, [rows, cols]
  TensorView data_t;  // FP8, [cols, rows]; empty() when there is no columnwise copy
  float* scale = nullptr;
  float* scale_inv = nullptr;
  float* amax = nullptr;

  DType dtype() const { return data.dtype; }
  Device device() const { return data.device; }
  bool has_columnwise() const { return !data_t.empty(); }
  // Throws qmesh::Error naming `what` unless data is FP8 and 2-D-compatible, data_t (if
  // present) is its transpose with the same dtype and device, and the scalars are set.
  void validate(const char* what) const;
};

class QMESH_API QuantizedTensor {
 public:
  QuantizedTensor() = default;
  // Storage for a [rows, cols] tensor of FP8 dtype `fp8` (with the transposed copy if
  // `columnwise`). Scalars start as scale = scale_inv = 1, amax = 0.
  QuantizedTensor(DType fp8, Shape shape, Device device, bool columnwise);

  QuantizedTensorView view() const;
  const Tensor& data() const { return data_; }
  const Tensor& data_t() const { return data_t_; }
  DType dtype() const { return data_.dtype(); }
  const Shape& shape() const { return data_.shape(); }
  Device device() const { return data_.device(); }
  bool has_columnwise() const { return data_t_.data() != nullptr; }
  // The three scalars as one fp32 tensor [3, kScalarSlot]: element 0 of row 0, 1, 2 holds
  // scale, scale_inv, amax; the rest is zero padding that keeps each row 16-byte aligned.
  static constexpr int64_t kScalarSlot = 4;
  const Tensor& scalars() const { return scalars_; }

 private:
  Tensor data_;
  Tensor data_t_;
  Tensor scalars_;
};

}  // namespace qmesh
