#include "qmesh/scaling/scaling_states.h"

#include <cmath>
#include <string>

#include "cuda/scaling.h"
#include "qmesh/copy.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/fp8.h"
#include "scaling/scale_rules.h"

namespace qmesh {

namespace {

// Host pass of the fused update over history [len, n] (row-major), all operands at once:
// row by row, so every inner loop runs over contiguous operands. Operand i's scale is
// scale[i * scale_stride].
void update_host(float* history, float* scale, int64_t scale_stride, const float* fp8_max, int n,
                 int len, bool most_recent, float margin_scale) {
  std::vector<float> current(history, history + n);
  // The window's max skips NaN, from 0 (docs/numerics.md "Delayed scaling").
  std::vector<float> window_max(n, 0.0f);
  for (int i = 0; i < n; ++i) window_max[i] = detail::skip_nan_max(0.0f, current[i]);
  for (int j = 0; j + 1 < len; ++j) {
    float* row = history + int64_t(j) * n;
    const float* next = row + n;
    for (int i = 0; i < n; ++i) {
      if (current[i] == 0.0f) continue;  // the operand did not run: no roll
      row[i] = next[i];
      window_max[i] = detail::skip_nan_max(window_max[i], next[i]);
    }
  }
  float* last = history + int64_t(len - 1) * n;
  for (int i = 0; i < n; ++i) {
    if (current[i] == 0.0f) continue;
    last[i] = current[i];
    history[i] = 0.0f;  // after the roll (for len == 1 the last row is row 0)
    const float amax = most_recent ? current[i] : window_max[i];
    float& s = scale[i * scale_stride];
    s = detail::delayed_scale(amax, s, detail::delayed_scaled_max(fp8_max[i], margin_scale));
  }
}

}  // namespace

ScalingStates::ScalingStates(const DelayedScaling& recipe, std::vector<OperandRole> roles,
                             Device device)
    : recipe_(recipe), roles_(std::move(roles)), device_(device) {
  validate(recipe_);
  QMESH_CHECK(!roles_.empty(), "ScalingStates needs at least one operand role");
  require_device(device_);
  const int n = size();
  const int64_t len = recipe_.amax_history_len;
  constexpr int64_t slot = QuantizedTensor::kScalarSlot;
  std::vector<float> zeros(len * n, 0.0f), unit_scales(n * slot, 0.0f), maxima(n);
  for (int i = 0; i < n; ++i) maxima[i] = fp8_max(dtype(i));
  for (int i = 0; i < n; ++i) unit_scales[i * slot] = 1.0f;
  history_ = Tensor(DType::kFloat32, Shape{len, n}, device_);
  scale_ = Tensor(DType::kFloat32, Shape{n, slot}, device_);
  scale_inv_ = Tensor(DType::kFloat32, Shape{n, slot}, device_);
  fp8_max_ = Tensor(DType::kFloat32, Shape{n}, device_);
  copy_bytes(history_.data(), device_, zeros.data(), Device::host(), history_.nbytes());
  copy_bytes(scale_.data(), device_, unit_scales.data(), Device::host(), scale_.nbytes());
  copy_bytes(scale_inv_.data(), device_, unit_scales.data(), Device::host(), scale_inv_.nbytes());
  copy_bytes(fp8_max_.data(), device_, maxima.data(), Device::host(), fp8_max_.nbytes());
}

OperandRole ScalingStates::role(int i) const {
  QMESH_CHECK(i >= 0 && i < size(), "operand index ", i, " out of range [0, ", size(), ")");
  return roles_[i];
}

DType ScalingStates::dtype(int i) const { return fp8_dtype(recipe_.fp8_format, role(i)); }

TensorView ScalingStates::current_amax() const {
  QMESH_CHECK(history_.data() != nullptr, "ScalingStates is empty (default-constructed)");
  return TensorView(history_.data(), DType::kFloat32, Shape{size()}, device_);
}

void ScalingStates::bind(int i, QuantizedTensorView& q) const {
  const DType expected = dtype(i);
  QMESH_CHECK(q.data.dtype == expected, "operand ", i, " is quantized to ", dtype_name(expected),
              " by this recipe, but the tensor bound to it holds ", dtype_name(q.data.dtype));
  check_device(q.data, device_, "tensor bound to operand " + std::to_string(i));
  q.amax = history_.data_as<float>() + i;
  q.scale = scale_.data_as<float>() + i * QuantizedTensor::kScalarSlot;
  q.scale_inv = scale_inv_.data_as<float>() + i * QuantizedTensor::kScalarSlot;
}

void ScalingStates::update(Stream stream) {
  QMESH_CHECK(history_.data() != nullptr, "ScalingStates is empty (default-constructed)");
  update_delayed_scaling(history_, scale_, fp8_max_, recipe_, stream);
}

void update_delayed_scaling(const TensorView& amax_history, const TensorView& scale,
                            const TensorView& fp8_max, const DelayedScaling& recipe,
                            Stream stream) {
  validate(recipe);
  const Device device = amax_history.device;
  check_dtype(amax_history, DType::kFloat32, "amax_history");
  QMESH_CHECK(amax_history.shape.rank() == 2, "amax_history must be [history_len, n], not ",
              amax_history.shape.str());
  const int len = static_cast<int>(amax_history.shape.dim(0));
  const int n = static_cast<int>(amax_history.shape.dim(1));
  QMESH_CHECK(len == recipe.amax_history_len, "amax_history has ", len,
              " rows but the recipe's amax_history_len is ", recipe.amax_history_len);
  for (const auto& [t, what] : {std::pair{&scale, "scale"}, std::pair{&fp8_max, "fp8_max"}}) {
    check_dtype(*t, DType::kFloat32, what);
    check_device(*t, device, what);
  }
  check_shape(fp8_max, Shape{n}, "fp8_max");
  QMESH_CHECK((scale.shape.rank() == 1 || scale.shape.rank() == 2) && scale.shape.dim(0) == n,
              "scale must be fp32 [", n, "] or [", n, ", k] (one row per operand), not ",
              scale.shape.str());
  const int64_t scale_stride = scale.shape.rank() == 2 ? scale.shape.dim(1) : 1;
  const bool most_recent = recipe.amax_compute_algo == AmaxComputeAlgo::kMostRecent;
  const auto margin_scale = static_cast<float>(std::exp2(-double(recipe.margin)));
  float* history = amax_history.data_as<float>();
  float* scales = scale.data_as<float>();
  const float* maxima = fp8_max.data_as<float>();
  detail::dispatch(
      device,
      [&] {
        update_host(history, scales, scale_stride, maxima, n, len, most_recent, margin_scale);
      },
      [&](auto index) {
        detail::cuda::update_scales(index, history, scales, scale_stride, maxima, n, len,
                                    most_recent, margin_scale, stream);
      });
}

}  // namespace qmesh
