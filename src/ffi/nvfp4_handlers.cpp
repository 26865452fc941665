// XLA FFI handlers of NVFP4 quantization (qmesh/ops/nvfp4_quantize.h): quantize (optionally with
// the columnwise copy) and dequantize of one copy. Each calls the qmesh op on XLA's buffers.
//
// x is read as its row-major 2-D view [rows, cols]. A copy is three buffers: the packed codes
// (uint8 [rows, cols / 2]), the E4M3 scales (float8_e4m3fn [rows, cols / 16]) and the per-tensor
// decode scale (float32 [1]); the columnwise copy's results are empty when it is not asked for.
// The stochastic rounding seed is an operand, int32 [2] (jax.random key data, bitcast): read by
// the cast where it runs. When x is a shard of a whole [whole_rows, whole_cols] tensor (attributes;
// 0, 0 when it is not) the cast takes three more operands, each empty when x is the whole
// tensor: amax and columnwise_amax (float32 [1], the whole tensor's amaxes: NvFp4Options::amax,
// columnwise_amax) and origin (int32 [2], x's first row and column in the whole tensor). The
// amax handler gives x's own amaxes (float32 [2], nvfp4_amax) that a sharded cast all-reduces.
#include <cstdint>

#include "ffi/ffi_support.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/ops/nvfp4_quantize.h"

namespace qmesh::ffi {
namespace {

// x, seed_key, amax, columnwise_amax, origin -> data, scale, scale_inv (and data_t, scale_t,
// scale_inv_t): op nvfp4_quantize.
void nvfp4_quantize_impl(const Where& w, AnyBuffer x, AnyBuffer seed_key, AnyBuffer amax,
                         AnyBuffer columnwise_amax, AnyBuffer origin, Result<AnyBuffer> data,
                         Result<AnyBuffer> scale, Result<AnyBuffer> scale_inv,
                         Result<AnyBuffer> data_t, Result<AnyBuffer> scale_t,
                         Result<AnyBuffer> scale_inv_t, bool stochastic_rounding, bool tiles_2d,
                         bool rht, int32_t rht_signs, int64_t whole_rows, int64_t whole_cols) {
  const TensorView input = matrix_view(x, w, "x");
  const int64_t rows = input.shape.rows(), cols = input.shape.cols();
  NvFp4TensorView out;
  out.data = packed_view(*data, w, rows, "data");
  out.scale = view(scale, w, "scale");
  out.scale_inv = view(scale_inv, w, "scale_inv");
  if (element_count(*data_t) != 0) {
    out.data_t = packed_view(*data_t, w, cols, "data_t (the columnwise copy)");
    out.scale_t = view(scale_t, w, "scale_t");
    out.scale_inv_t = view(scale_inv_t, w, "scale_inv_t");
  }
  NvFp4Options options = nvfp4_transform(rht, rht_signs);
  options.stochastic_rounding = stochastic_rounding;
  options.tiles_2d = tiles_2d;
  options.seed_key = view(seed_key, w, "seed_key");
  if (element_count(amax) != 0) options.amax = view(amax, w, "amax");
  if (element_count(columnwise_amax) != 0)
    options.columnwise_amax = view(columnwise_amax, w, "columnwise_amax");
  if (element_count(origin) != 0) options.origin = view(origin, w, "origin");
  options.whole_rows = whole_rows;
  options.whole_cols = whole_cols;
  nvfp4_quantize(input, out, options, w.stream);
}

// x -> amax (float32 [2]): op nvfp4_amax.
void nvfp4_amax_impl(const Where& w, AnyBuffer x, Result<AnyBuffer> amax, bool rht,
                     int32_t rht_signs) {
  nvfp4_amax(matrix_view(x, w, "x"), view(amax, w, "amax"), nvfp4_transform(rht, rht_signs),
             w.stream);
}

// data, scale, scale_inv -> out = the copy's values (fp32, bf16 or fp16, [rows, cols]).
void nvfp4_dequantize_impl(const Where& w, AnyBuffer data, AnyBuffer scale, AnyBuffer scale_inv,
                           Result<AnyBuffer> out) {
  const TensorView s = view(scale, w, "scale");
  NvFp4TensorView in;
  in.data = packed_view(data, w, s.shape.rows(), "data");
  in.scale = s;
  in.scale_inv = view(scale_inv, w, "scale_inv");
  nvfp4_dequantize(in, view(out, w, "out"), false, w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshNvfp4Quantize, qmesh::ffi::nvfp4_quantize_impl,
                  .Arg<AnyBuffer>()      // x
                      .Arg<AnyBuffer>()  // seed_key
                      .Arg<AnyBuffer>()  // amax
                      .Arg<AnyBuffer>()  // columnwise_amax
                      .Arg<AnyBuffer>()  // origin
                      .Ret<AnyBuffer>()  // data
                      .Ret<AnyBuffer>()  // scale
                      .Ret<AnyBuffer>()  // scale_inv
                      .Ret<AnyBuffer>()  // data_t
                      .Ret<AnyBuffer>()  // scale_t
                      .Ret<AnyBuffer>()  // scale_inv_t
                      .Attr<bool>("stochastic_rounding")
                      .Attr<bool>("tiles_2d")
                      .Attr<bool>("rht")
                      .Attr<int32_t>("rht_signs")
                      .Attr<int64_t>("whole_rows")
                      .Attr<int64_t>("whole_cols"));

QMESH_FFI_HANDLER(QmeshNvfp4Amax, qmesh::ffi::nvfp4_amax_impl,
                  .Arg<AnyBuffer>()      // x
                      .Ret<AnyBuffer>()  // amax
                      .Attr<bool>("rht")
                      .Attr<int32_t>("rht_signs"));

QMESH_FFI_HANDLER(QmeshNvfp4Dequantize, qmesh::ffi::nvfp4_dequantize_impl,
                  .Arg<AnyBuffer>()        // data
                      .Arg<AnyBuffer>()    // scale
                      .Arg<AnyBuffer>()    // scale_inv
                      .Ret<AnyBuffer>());  // out
