// XLA FFI handler of the delayed-scaling update of many tensors in one call
// (qmesh::update_delayed_scaling: amax history roll, margin, new scale).
#include "ffi/ffi_support.h"
#include "qmesh/copy.h"
#include "qmesh/scaling/scaling_states.h"

namespace qmesh::ffi {
namespace {

// amax_history fp32 [L, n] (row 0: this step's amaxes, already reduced over the mesh), scale
// fp32 [n], fp8_max fp32 [n] -> the updated history and scale (the Python primitive aliases
// them to the inputs, so XLA may update in place). `amax_compute_algo`: 0 max, 1 most_recent.
void delayed_update_impl(const Where& w, AnyBuffer history, AnyBuffer scale, AnyBuffer fp8_max,
                         Result<AnyBuffer> new_history, Result<AnyBuffer> new_scale, float margin,
                         int32_t amax_compute_algo) {
  const TensorView h = view(history, w, "amax_history");
  QMESH_CHECK(h.shape.rank() == 2, "amax_history must be [history_len, n], not ", h.shape.str());
  require_dtype(*new_history, {DType::kFloat32}, "new amax_history");
  require_dtype(*new_scale, {DType::kFloat32}, "new scale");
  require_count(*new_history, h.numel(), "new amax_history");
  require_count(*new_scale, element_count(scale), "new scale");
  QMESH_CHECK(amax_compute_algo == 0 || amax_compute_algo == 1,
              "amax_compute_algo must be 0 (max) or 1 (most_recent), not ", amax_compute_algo);
  const TensorView out_h(new_history->untyped_data(), DType::kFloat32, h.shape, w.device);
  const TensorView s = view(scale, w, "scale");
  const TensorView out_s(new_scale->untyped_data(), DType::kFloat32, s.shape, w.device);
  if (out_h.data != h.data)
    copy_bytes_async(out_h.data, w.device, h.data, w.device, h.nbytes(), w.stream);
  if (out_s.data != s.data)
    copy_bytes_async(out_s.data, w.device, s.data, w.device, s.nbytes(), w.stream);
  const DelayedScaling recipe{.margin = margin,
                              .amax_history_len = static_cast<int>(h.shape.dim(0)),
                              .amax_compute_algo = static_cast<AmaxComputeAlgo>(amax_compute_algo)};
  update_delayed_scaling(out_h, out_s, view(fp8_max, w, "fp8_max"), recipe, w.stream);
}

}  // namespace
}  // namespace qmesh::ffi

using xla::ffi::AnyBuffer;

QMESH_FFI_HANDLER(QmeshDelayedScalingUpdate, qmesh::ffi::delayed_update_impl,
                  .Arg<AnyBuffer>()      // amax_history
                      .Arg<AnyBuffer>()  // scale
                      .Arg<AnyBuffer>()  // fp8_max
                      .Ret<AnyBuffer>()  // new amax_history
                      .Ret<AnyBuffer>()  // new scale
                      .Attr<float>("margin")
                      .Attr<int32_t>("amax_compute_algo"));
