// The internal description of one MXFP8 cast (ops/mxfp8_quantize.h) that both backends
// execute. Both walk 32 x 32 tiles; every 1x32 and 32x1 block lies in one tile.
#pragma once

#include <cstdint>

#include "qmesh/dtype.h"

namespace qmesh::detail {

struct MxCastJob {
  DType in_dtype = DType::kFloat32;  // fp32, bf16 or fp16
  DType fp8 = DType::kFloat8E4M3;
  float scaled_max = 0.0f;  // fp8_max * 2^-margin, the largest code value a block uses
  const void* in = nullptr;
  int64_t rows = 0;  // multiples of 32
  int64_t cols = 0;
  uint8_t* out = nullptr;      // rowwise codes [rows, cols]
  uint8_t* scale = nullptr;    // E8M0 [rows, cols / 32]
  uint8_t* out_t = nullptr;    // columnwise codes [cols, rows]; null: none
  uint8_t* scale_t = nullptr;  // E8M0 [cols, rows / 32]
  float* dbias = nullptr;      // fp32 [cols]; null: none
};

// A dequantization of rowwise MXFP8 codes [rows, cols] into out (fp32, bf16 or fp16).
struct MxDequantizeJob {
  const uint8_t* in = nullptr;
  DType fp8 = DType::kFloat8E4M3;
  const uint8_t* scale = nullptr;  // E8M0 [rows, cols / 32]
  int64_t rows = 0;
  int64_t cols = 0;
  void* out = nullptr;
  DType out_dtype = DType::kFloat32;
};

}  // namespace qmesh::detail
