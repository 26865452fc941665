// The internal description of one cast that every backend executes: quantize, amax,
// cast_transpose, dbias_quantize, grouped_quantize and the GELU-fused casts are all lists of
// CastJobs.
#pragma once

#include <cstdint>

#include "qmesh/dtype.h"

namespace qmesh::detail {

// How a cast writes its amax: kReplace stores max|in| (the amax op); kRunningMax stores
// max(*amax, max|in|) (the quantizing ops, so that the micro-batches of one step accumulate
// in the delayed-scaling history until the scaling update zeroes it). Both compare the fp32
// bits as unsigned integers (NaN above +inf).
enum class AmaxUpdate { kReplace, kRunningMax };

// What a cast applies to each input element before it quantizes, sums and takes the amax of
// it (the fused casts of ops/activation_cast.h): the value itself, gelu(x), or x · gelu'(pre).
enum class CastActivation { kNone, kGelu, kDgelu };

// rows x cols elements of `in` (row-major). Null outputs are not produced.
struct CastJob {
  const void* in = nullptr;
  const void* pre = nullptr;  // CastActivation::kDgelu: [rows, cols] of the input's dtype
  int64_t rows = 0;
  int64_t cols = 0;
  uint8_t* out = nullptr;    // rowwise codes [rows, cols]; null: amax only
  uint8_t* out_t = nullptr;  // columnwise codes [cols, rows]
  float* dbias = nullptr;    // fp32 [cols]: column sums of `in`
  const float* scale = nullptr;
  float* scale_inv = nullptr;  // written as 1 / *scale when `out` is set
  float* amax = nullptr;       // always written, per amax_update
  AmaxUpdate amax_update = AmaxUpdate::kRunningMax;
};

// What the jobs of one call share: the input dtype (fp32, bf16, fp16), the FP8 format and
// the activation applied first.
struct CastSpec {
  DType in_dtype = DType::kFloat32;
  DType fp8 = DType::kFloat8E4M3;
  CastActivation activation = CastActivation::kNone;
};

}  // namespace qmesh::detail
