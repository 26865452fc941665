// Where the FP8 precision goes: per quantized GEMM operand of a model, how far the FP8
// values are from the fp32 ones and why (train_mlp --fp8-stats, docs/fp8-loss.md).
// Host tensors only (the CPU backend); collected by the OperandCast of every layer built on
// a LayerContext that has a collector (LayerContextOptions::fp8_stats). Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "qmesh/export.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/scaling/recipe.h"
#include "qmesh/tensor.h"

namespace qmesh {

// Sums over every cast of one operand.
struct Fp8OperandStats {
  OperandRole role = OperandRole::kInput;
  int64_t casts = 0;
  int64_t values = 0;     // elements quantized
  int64_t saturated = 0;  // |x * scale| > the FP8 dtype's largest finite value (clipped)
  int64_t flushed = 0;    // x != 0 whose FP8 value is 0
  double error_sq = 0;    // sum of (dequantized - x)^2, float64
  double value_sq = 0;    // sum of x^2, float64
  // Relative RMS error of each cast (sqrt of its error_sq / value_sq): the sum over casts
  // and the latest (training-end precision, which early large tensors do not swamp).
  double rel_error_sum = 0;
  double rel_error_last = 0;
  // Scale staleness: amax(x) / the amax the scale was computed from
  // (fp8_max / (scale * 2^margin)); 1 means the scale fits this tensor exactly, < 1 that
  // the scale came from larger values (range unused), > 1 that values saturate.
  double staleness_sum = 0;
  double staleness_min = 0;
  double staleness_max = 0;
  double staleness_last = 0;
};

class QMESH_API Fp8Stats {
 public:
  // Registers one operand; returns its id for record().
  int add(OperandRole role);
  // Records one cast of operand `id`: x fp32 (2-D, on the host), q its FP8 codes (same
  // shape) with the scale it was quantized with; margin: the delayed-scaling margin the
  // scale carries (0 for current scaling). Error if a tensor is not on the host.
  void record(int id, const TensorView& x, const QuantizedTensorView& q, float margin);
  const std::vector<Fp8OperandStats>& operands() const { return operands_; }
  // A table, one row per operand: role, relative RMS error (over all casts, mean of the
  // casts, latest cast), saturated and flushed fractions, staleness (mean [min, max],
  // latest).
  std::string report() const;

 private:
  std::vector<Fp8OperandStats> operands_;
};

}  // namespace qmesh
