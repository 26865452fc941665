// XLA FFI handlers of grouped MXFP8 and NVFP4 quantization (qmesh/ops/grouped_quantize.h):
// x [rows, cols] holds groups of group_sizes[g] rows back to back (int32 [G], read on the
// host), each quantized as the non-grouped op of its rows. Every group's rows must be a
// multiple of the block (32 for MXFP8, 16 for NVFP4).
//
// Rowwise results are the groups' rows in order, so they keep the non-grouped shapes. The
// columnwise copy and its scales are flat: group g's [cols, rows_g] transpose (and its scales
// [cols, rows_g / block]) back to back. With whole-block groups every part has a fixed size,
// so no buffer needs room for padding.
#include <cstdint>
#include <vector>

#include "ffi/ffi_support.h"
#include "qmesh/copy.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/ops/grouped_quantize.h"

namespace qmesh::ffi {
namespace {

// Error naming `what` unless the buffer is uint8 (packed float4_e2m1fn codes, two per byte).
void require_packed(const AnyBuffer& buffer, const char* what) {
  QMESH_CHECK(buffer.element_type() == xffi::DataType::U8, what,
              " must be uint8 (two float4_e2m1fn codes per byte)");
}

// The next `shape` of a flat buffer of `type` from element `at` on (an element of `bytes`).
TensorView part(void* base, DType type, int64_t bytes, int64_t at, const Shape& shape,
                const Where& w) {
  return TensorView(static_cast<char*>(base) + at * bytes, type, shape, w.device);
}

// x, group_sizes -> q [rows, cols], scale [rows, cols / 32] (and q_t, scale_t flat; empty
// without the columnwise copy): op grouped_mxfp8_quantize.
void grouped_mxfp8_quantize_impl(const Where& w, AnyBuffer x, AnyBuffer group_sizes,
                                 Result<AnyBuffer> q, Result<AnyBuffer> scale,
                                 Result<AnyBuffer> q_t, Result<AnyBuffer> scale_t, float margin) {
  const TensorView input = matrix_view(x, w, "x");
  const int64_t cols = input.shape.cols(), blocks = cols / kMxBlock;
  const std::vector<int32_t> rows = group_rows(w, group_sizes, input.shape.rows(), kMxBlock);
  require_count(*q, input.numel(), "q (the codes, shaped like x)");
  require_count(*scale, input.numel() / kMxBlock, "scale ([rows, cols / 32])");
  const DType fp8 = to_dtype(q->element_type(), "q"),
              e8m0 = to_dtype(scale->element_type(), "scale");
  const bool columnwise = element_count(*q_t) != 0;
  if (columnwise) {
    QMESH_CHECK(q_t->element_type() == q->element_type(), "q_t must have q's FP8 dtype");
    require_count(*q_t, input.numel(), "q_t (the groups' transposes, flat)");
    require_count(*scale_t, input.numel() / kMxBlock, "scale_t (the groups' scales, flat)");
  }
  std::vector<MxFp8TensorView> outs(rows.size());
  int64_t row = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    if (rows[g] > 0) {  // an empty group keeps empty views
      MxFp8TensorView& out = outs[g];
      out.data = part(q->untyped_data(), fp8, 1, row * cols, Shape{rows[g], cols}, w);
      out.scale = part(scale->untyped_data(), e8m0, 1, row * blocks, Shape{rows[g], blocks}, w);
      if (columnwise) {
        out.data_t = part(q_t->untyped_data(), fp8, 1, row * cols, Shape{cols, rows[g]}, w);
        out.scale_t = part(scale_t->untyped_data(), e8m0, 1, row * blocks,
                           Shape{cols, rows[g] / kMxBlock}, w);
      }
    }
    row += rows[g];
  }
  grouped_mxfp8_quantize(input, outs, margin, w.stream);
}

// The stochastic rounding seed of int32 [2] key words (copied to the host, waited for):
// uint32(key[0]) << 32 | key[1], as nvfp4_quantize reads them.
uint64_t host_seed(const AnyBuffer& key, const Where& w) {
  require_dtype(key, {DType::kInt32}, "seed_key");
  require_count(key, 2, "seed_key (two key words)");
  uint32_t words[2] = {0, 0};
  copy_bytes_async(words, Device::host(), key.untyped_data(), w.device, sizeof(words), w.stream);
  synchronize(w.device, w.stream);
  return (uint64_t(words[0]) << 32) | words[1];
}

// x, group_sizes, seed_key, two zero-filled [G] buffers (aliased to scale_inv, scale_inv_t) ->
// data uint8 [rows, cols / 2], scale [rows, cols / 16], scale_inv [G] (and data_t, scale_t
// flat, scale_inv_t [G]; empty without the columnwise copy): op grouped_nvfp4_quantize. An
// empty group's scale_inv entries stay 0.
void grouped_nvfp4_quantize_impl(const Where& w, AnyBuffer x, AnyBuffer group_sizes,
                                 AnyBuffer seed_key, AnyBuffer /*scale_inv_zeros*/,
                                 AnyBuffer /*scale_inv_t_zeros*/, Result<AnyBuffer> data,
                                 Result<AnyBuffer> scale, Result<AnyBuffer> scale_inv,
                                 Result<AnyBuffer> data_t, Result<AnyBuffer> scale_t,
                                 Result<AnyBuffer> scale_inv_t, bool stochastic_rounding,
                                 bool tiles_2d, bool rht, int32_t rht_signs) {
  const TensorView input = matrix_view(x, w, "x");
  const int64_t cols = input.shape.cols(), blocks = cols / kNvFp4Block;
  const std::vector<int32_t> rows = group_rows(w, group_sizes, input.shape.rows(), kNvFp4Block);
  const auto groups = static_cast<int64_t>(rows.size());
  constexpr DType kPacked = DType::kFloat4E2M1x2, kF32 = DType::kFloat32;
  require_packed(*data, "data");
  require_count(*data, input.numel() / 2, "data ([rows, cols / 2])");
  require_count(*scale, input.numel() / kNvFp4Block, "scale ([rows, cols / 16])");
  require_dtype(*scale_inv, {kF32}, "scale_inv");
  require_count(*scale_inv, groups, "scale_inv (one per group)");
  const DType e4m3 = to_dtype(scale->element_type(), "scale");
  const bool columnwise = element_count(*data_t) != 0;
  if (columnwise) {
    require_packed(*data_t, "data_t");
    require_count(*data_t, input.numel() / 2, "data_t (the groups' transposes, flat)");
    require_count(*scale_t, input.numel() / kNvFp4Block, "scale_t (the groups' scales, flat)");
    require_dtype(*scale_inv_t, {kF32}, "scale_inv_t");
    require_count(*scale_inv_t, groups, "scale_inv_t (one per group)");
  }
  std::vector<NvFp4TensorView> outs(rows.size());
  int64_t row = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    if (rows[g] > 0) {  // an empty group keeps empty views
      NvFp4TensorView& out = outs[g];
      const auto at = static_cast<int64_t>(g);
      out.data =
          part(data->untyped_data(), kPacked, 1, row * cols / 2, Shape{rows[g], cols / 2}, w);
      out.scale = part(scale->untyped_data(), e4m3, 1, row * blocks, Shape{rows[g], blocks}, w);
      out.scale_inv = part(scale_inv->untyped_data(), kF32, 4, at, Shape{1}, w);
      if (columnwise) {
        out.data_t =
            part(data_t->untyped_data(), kPacked, 1, row * cols / 2, Shape{cols, rows[g] / 2}, w);
        out.scale_t = part(scale_t->untyped_data(), e4m3, 1, row * blocks,
                           Shape{cols, rows[g] / kNvFp4Block}, w);
        out.scale_inv_t = part(scale_inv_t->untyped_data(), kF32, 4, at, Shape{1}, w);
      }
    }
    row += rows[g];
  }
  NvFp4Options options = nvfp4_transform(rht, rht_signs);
  options.stochastic_rounding = stochastic_rounding;
  options.seed = stochastic_rounding ? host_seed(seed_key, w) : 0;
  options.tiles_2d = tiles_2d;
  grouped_nvfp4_quantize(input, outs, options, w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshGroupedMxfp8Quantize, qmesh::ffi::grouped_mxfp8_quantize_impl,
                  .Arg<AnyBuffer>()      // x
                      .Arg<AnyBuffer>()  // group_sizes
                      .Ret<AnyBuffer>()  // q
                      .Ret<AnyBuffer>()  // scale
                      .Ret<AnyBuffer>()  // q_t
                      .Ret<AnyBuffer>()  // scale_t
                      .Attr<float>("margin"));

QMESH_FFI_HANDLER(QmeshGroupedNvfp4Quantize, qmesh::ffi::grouped_nvfp4_quantize_impl,
                  .Arg<AnyBuffer>()      // x
                      .Arg<AnyBuffer>()  // group_sizes
                      .Arg<AnyBuffer>()  // seed_key
                      .Arg<AnyBuffer>()  // scale_inv zeros (aliased to scale_inv)
                      .Arg<AnyBuffer>()  // scale_inv_t zeros (aliased to scale_inv_t)
                      .Ret<AnyBuffer>()  // data
                      .Ret<AnyBuffer>()  // scale
                      .Ret<AnyBuffer>()  // scale_inv
                      .Ret<AnyBuffer>()  // data_t
                      .Ret<AnyBuffer>()  // scale_t
                      .Ret<AnyBuffer>()  // scale_inv_t
                      .Attr<bool>("stochastic_rounding")
                      .Attr<bool>("tiles_2d")
                      .Attr<bool>("rht")
                      .Attr<int32_t>("rht_signs"));
