#include "qmesh/layers/fp8_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "qmesh/error.h"
#include "qmesh/fp8.h"

namespace qmesh {
namespace {

std::string_view role_name(OperandRole role) {
  switch (role) {
    case OperandRole::kInput:
      return "input";
    case OperandRole::kWeight:
      return "weight";
    case OperandRole::kGradOutput:
      return "grad_output";
  }
  return "?";
}

}  // namespace

int Fp8Stats::add(OperandRole role) {
  operands_.push_back({});
  operands_.back().role = role;
  return static_cast<int>(operands_.size()) - 1;
}

void Fp8Stats::record(int id, const TensorView& x, const QuantizedTensorView& q, float margin) {
  QMESH_CHECK(id >= 0 && id < static_cast<int>(operands_.size()), "Fp8Stats: no operand ", id);
  QMESH_CHECK(x.device.is_host() && q.device().is_host(),
              "--fp8-stats reads the operands on the host: use the CPU backend (--device cpu)");
  QMESH_CHECK(x.dtype == DType::kFloat32 && x.numel() == q.data.numel(),
              "Fp8Stats: x must be fp32 with as many elements as its FP8 codes");
  const float* in = x.data_as<float>();
  const auto* codes = static_cast<const uint8_t*>(q.data.data);
  const bool e4m3 = q.dtype() == DType::kFloat8E4M3;
  const double scale = *q.scale, scale_inv = *q.scale_inv, max = fp8_max(q.dtype());
  Fp8OperandStats& s = operands_[static_cast<size_t>(id)];
  double amax = 0, error_sq = 0, value_sq = 0;
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double v = in[i];
    const double d = (e4m3 ? e4m3_to_float(codes[i]) : e5m2_to_float(codes[i])) * scale_inv;
    amax = std::max(amax, std::fabs(v));
    error_sq += (d - v) * (d - v);
    value_sq += v * v;
    s.saturated += std::fabs(v * scale) > max;
    s.flushed += v != 0 && d == 0;
  }
  s.error_sq += error_sq;
  s.value_sq += value_sq;
  s.rel_error_last = value_sq > 0 ? std::sqrt(error_sq / value_sq) : 0.0;
  s.rel_error_sum += s.rel_error_last;
  const double source_amax = max / (scale * std::exp2(double(margin)));
  const double staleness = amax / source_amax;
  s.staleness_min = s.casts == 0 ? staleness : std::min(s.staleness_min, staleness);
  s.staleness_max = s.casts == 0 ? staleness : std::max(s.staleness_max, staleness);
  s.staleness_sum += staleness;
  s.staleness_last = staleness;
  s.values += n;
  ++s.casts;
}

std::string Fp8Stats::report() const {
  std::string out =
      "operand role         casts   relative RMS error (all, mean, last)  saturated    flushed"
      "   staleness mean [min, max] last\n";
  char line[256];
  for (size_t i = 0; i < operands_.size(); ++i) {
    const Fp8OperandStats& s = operands_[i];
    const double values = std::max<double>(1, double(s.values));
    const double casts = std::max<double>(1, double(s.casts));
    std::snprintf(line, sizeof line,
                  "%7zu %-12s %6lld   %9.3e %9.3e %9.3e           %9.2e  %9.2e   %6.3f "
                  "[%.3f, %.3f] %.3f\n",
                  i, std::string(role_name(s.role)).c_str(), (long long)s.casts,
                  s.value_sq > 0 ? std::sqrt(s.error_sq / s.value_sq) : 0.0,
                  s.rel_error_sum / casts, s.rel_error_last, double(s.saturated) / values,
                  double(s.flushed) / values, s.staleness_sum / casts, s.staleness_min,
                  s.staleness_max, s.staleness_last);
    out += line;
  }
  return out;
}

}  // namespace qmesh
