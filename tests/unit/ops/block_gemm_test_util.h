// Test operands for the block-scaled FP8 GEMM: random codes and random scales written straight
// into BlockQuantizedTensor storage (independent of the quantize kernels), their exact
// dequantized values in float64, and the float64 reference of D = op(A) · op(B) from the
// copies that the GEMM reads (qmesh/ops/gemm.h: the copy contiguous along K).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gemm_test_util.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/ops/gemm.h"

namespace qmesh::test {

// One copy (rowwise or columnwise) of a block-scaled operand, on the host: codes [rows, cols]
// and its scales in the layout of qmesh/block_quantized_tensor.h.
struct BlockCopy {
  DType dtype = DType::kFloat8E4M3;
  BlockShape block = BlockShape::k1x128;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // block_scale_shape(rows, cols, block), padding 0

  int64_t scale_ld() const { return block_scale_shape(rows, cols, block).cols(); }
  // Index in `scales` of the scale of element (r, c), written out from the header's layout.
  size_t scale_index(int64_t r, int64_t c) const {
    return block == BlockShape::k1x128 ? size_t((c / kScaleBlock) * scale_ld() + r)
                                       : size_t((r / kScaleBlock) * scale_ld() + c / kScaleBlock);
  }
  double value(int64_t r, int64_t c) const {
    return decode(dtype, &codes[size_t(r * cols + c)]) * double(scales[scale_index(r, c)]);
  }
  // Whether (r, c) is the first element of its block.
  bool block_first(int64_t r, int64_t c) const {
    return c % kScaleBlock == 0 && (block == BlockShape::k1x128 || r % kScaleBlock == 0);
  }
};

// Random finite codes (every magnitude up to the format's maximum, both signs) and random
// scales: powers of two from 2^-12 to 2^4 when `pow2_scales`, else arbitrary values in
// [2^-12, 2^4]. Scales that differ by up to 2^16 between blocks make any block mixed up by the
// GEMM stand out.
inline void fill_random(BlockCopy& copy, std::mt19937& rng, bool pow2_scales) {
  const double max = fp8_max(copy.dtype);
  std::uniform_real_distribution<double> value(-max, max);
  copy.codes.resize(size_t(copy.rows * copy.cols));
  for (uint8_t& code : copy.codes) encode(copy.dtype, value(rng), &code);
  copy.scales.assign(size_t(block_scale_shape(copy.rows, copy.cols, copy.block).numel()), 0.0f);
  std::uniform_int_distribution<int> exponent(-12, 4);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  for (int64_t r = 0; r < copy.rows; ++r)
    for (int64_t c = 0; c < copy.cols; ++c) {
      if (!copy.block_first(r, c)) continue;
      const double e = std::ldexp(1.0, exponent(rng));
      copy.scales[copy.scale_index(r, c)] = float(pow2_scales ? e : e * mantissa(rng));
    }
}

// A block-scaled operand [rows, cols] with its columnwise copy. With 1x128 blocks the copy is
// the transpose of the codes with scales of its own (blocks along the other dimension, so its
// values differ from the rowwise ones: a GEMM that reads the wrong copy is caught); with
// 128x128 tiles it holds the same values, its scales the transposed tile scales.
struct BlockOperand {
  BlockCopy rowwise, columnwise;
  BlockQuantizedTensor tensor;

  BlockOperand(DType dtype, BlockShape block, int64_t rows, int64_t cols, uint32_t seed,
               bool pow2_scales = false, bool with_columnwise = true)
      : tensor(dtype, Shape{rows, cols}, block, Device::host(), with_columnwise) {
    std::mt19937 rng(seed);
    rowwise = {dtype, block, rows, cols, {}, {}};
    fill_random(rowwise, rng, pow2_scales);
    columnwise = {dtype, block, cols, rows, {}, {}};
    columnwise.codes.resize(rowwise.codes.size());
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        columnwise.codes[size_t(c * rows + r)] = rowwise.codes[size_t(r * cols + c)];
    if (block == BlockShape::k1x128) {
      std::vector<uint8_t> codes = columnwise.codes;
      fill_random(columnwise, rng, pow2_scales);
      columnwise.codes = codes;
    } else {
      columnwise.scales.assign(size_t(block_scale_shape(cols, rows, block).numel()), 0.0f);
      for (int64_t r = 0; r < rows; r += kScaleBlock)
        for (int64_t c = 0; c < cols; c += kScaleBlock)
          columnwise.scales[columnwise.scale_index(c, r)] =
              rowwise.scales[rowwise.scale_index(r, c)];
    }
    store(rowwise, tensor.data(), tensor.scale_inv());
    if (with_columnwise) store(columnwise, tensor.data_t(), tensor.scale_inv_t());
  }

  static void store(const BlockCopy& copy, const Tensor& data, const Tensor& scales) {
    std::memcpy(data.data(), copy.codes.data(), copy.codes.size());
    std::memcpy(scales.data(), copy.scales.data(), copy.scales.size() * sizeof(float));
  }
  GemmOperand operand() const { return GemmOperand::fp8_block(tensor.view()); }
};

// The arguments of D = op(A) · op(B) over block-scaled operands (views of tensors the caller
// keeps alive).
inline GemmArgs block_args(const BlockQuantizedTensor& a, const BlockQuantizedTensor& b,
                           const TensorView& d, GemmTranspose ta = GemmTranspose::kNo,
                           GemmTranspose tb = GemmTranspose::kYes) {
  GemmArgs g;
  g.a = GemmOperand::fp8_block(a.view());
  g.b = GemmOperand::fp8_block(b.view());
  g.trans_a = ta;
  g.trans_b = tb;
  g.d = d;
  return g;
}

// op(A) [M, K] as the GEMM reads it: from A's rowwise copy when A is stored [M, K] (kNo),
// else from its columnwise copy [M, K].
inline std::vector<double> op_a_values(const BlockOperand& a, GemmTranspose ta) {
  const BlockCopy& copy = ta == GemmTranspose::kNo ? a.rowwise : a.columnwise;
  std::vector<double> v(size_t(copy.rows * copy.cols));
  for (int64_t r = 0; r < copy.rows; ++r)
    for (int64_t c = 0; c < copy.cols; ++c) v[size_t(r * copy.cols + c)] = copy.value(r, c);
  return v;
}
// op(B)ᵀ [N, K] as the GEMM reads it: B's rowwise copy when B is stored [N, K] (kYes), else
// its columnwise copy.
inline std::vector<double> op_bt_values(const BlockOperand& b, GemmTranspose tb) {
  return op_a_values(b, tb == GemmTranspose::kYes ? GemmTranspose::kNo : GemmTranspose::kYes);
}

// D = alpha · op(A) · op(B) in float64, from op(A) [M, K] and op(B)ᵀ [N, K].
inline std::vector<double> block_reference(const std::vector<double>& a,
                                           const std::vector<double>& bt, int64_t m, int64_t n,
                                           int64_t k, double alpha) {
  std::vector<double> d(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double s = 0;
      for (int64_t p = 0; p < k; ++p) s += a[size_t(i * k + p)] * bt[size_t(j * k + p)];
      d[size_t(i * n + j)] = alpha * s;
    }
  return d;
}

}  // namespace qmesh::test
