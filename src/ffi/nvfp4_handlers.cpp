// XLA FFI handlers of NVFP4 quantization (qmesh/ops/nvfp4_quantize.h): quantize (optionally with
// the columnwise copy) and dequantize of one copy. Each calls the qmesh op on XLA's buffers.
//
// x is read as its row-major 2-D view [rows, cols]. A copy is three buffers: the packed codes
// (uint8 [rows, cols / 2]), the E4M3 scales (float8_e4m3fn [rows, cols / 16]) and the per-tensor
// decode scale (float32 [1]); the columnwise copy's results are empty when it is not asked for.
// The stochastic rounding seed is an operand, int32 [2] (jax.random key data, bitcast): read by
// the cast where it runs. The amax operand is float32 [1], the amax of the whole tensor of which
// x is a shard (NvFp4Options::amax), or empty: x's own.
#include <cstdint>

#include "ffi/ffi_support.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/ops/nvfp4_quantize.h"

namespace qmesh::ffi {
namespace {

// x, seed_key, amax -> data, scale, scale_inv (and data_t, scale_t, scale_inv_t): op
// nvfp4_quantize.
void nvfp4_quantize_impl(const Where& w, AnyBuffer x, AnyBuffer seed_key, AnyBuffer amax,
                         Result<AnyBuffer> data, Result<AnyBuffer> scale,
                         Result<AnyBuffer> scale_inv, Result<AnyBuffer> data_t,
                         Result<AnyBuffer> scale_t, Result<AnyBuffer> scale_inv_t,
                         bool stochastic_rounding, bool tiles_2d, bool rht, int32_t rht_signs) {
  const TensorView v = view(x, w, "x");
  const TensorView input(v.data, v.dtype, Shape{v.shape.rows(), v.shape.cols()}, w.device);
  const int64_t rows = input.shape.rows(), cols = input.shape.cols();
  QMESH_CHECK(rht_signs >= 0 && rht_signs < 0x10000, "rht_signs must be a 16-bit mask, got ",
              rht_signs);
  NvFp4TensorView out;
  out.data = packed_view(*data, w, rows, "data");
  out.scale = view(scale, w, "scale");
  out.scale_inv = view(scale_inv, w, "scale_inv");
  if (element_count(*data_t) != 0) {
    out.data_t = packed_view(*data_t, w, cols, "data_t (the columnwise copy)");
    out.scale_t = view(scale_t, w, "scale_t");
    out.scale_inv_t = view(scale_inv_t, w, "scale_inv_t");
  }
  NvFp4Options options;
  options.stochastic_rounding = stochastic_rounding;
  options.tiles_2d = tiles_2d;
  options.rht = rht;
  options.rht_signs = static_cast<uint16_t>(rht_signs);
  options.seed_key = view(seed_key, w, "seed_key");
  if (element_count(amax) != 0) options.amax = view(amax, w, "amax");
  nvfp4_quantize(input, out, options, w.stream);
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

QMESH_FFI_HANDLER(QmeshNvfp4Dequantize, qmesh::ffi::nvfp4_dequantize_impl,
                  .Arg<AnyBuffer>()        // data
                      .Arg<AnyBuffer>()    // scale
                      .Arg<AnyBuffer>()    // scale_inv
                      .Ret<AnyBuffer>());  // out
