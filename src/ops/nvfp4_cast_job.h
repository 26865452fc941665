// The internal description of one NVFP4 cast (ops/nvfp4_quantize.h) that both backends execute
// (cpu/nvfp4_cast.cpp, cuda/nvfp4_cast.cu), and the block steps they share.
#pragma once

#include <cstdint>

#include "cpu/gelu.h"
#include "ops/nvfp4_rules.h"
#include "qmesh/dtype.h"

namespace qmesh::detail {

// One copy of the quantized tensor: copy 0 is x itself ([rows, cols]), copy 1 its transpose
// ([cols, rows]). Row i, column j of a copy is x[i, j] or x[j, i].
struct NvFp4CopyOut {
  uint8_t* data = nullptr;     // packed codes [copy rows, copy cols / 2]; null: no such copy
  uint8_t* scale = nullptr;    // E4M3 [copy rows, copy cols / 16]
  float* scale_inv = nullptr;  // [1]
};

// Stochastic rounding's inputs, read once where the cast runs.
struct NvFp4Rounding {
  uint64_t seed = 0;
  int64_t row0 = 0, col0 = 0;  // x's origin in the whole tensor
};

struct NvFp4CastJob {
  DType in_dtype = DType::kFloat32;  // fp32, bf16 or fp16
  const void* in = nullptr;
  int64_t rows = 0;  // of x; multiples of 16
  int64_t cols = 0;
  int64_t whole_rows = 0;  // of the whole tensor x is a shard of (x's own shape if none)
  int64_t whole_cols = 0;
  // NvFp4Options as plain values (a kernel argument copies them bitwise).
  bool stochastic_rounding = false;
  bool tiles_2d = false;
  bool rht_columnwise = false;
  uint16_t rht_signs = 0;
  uint64_t seed = 0;
  const uint32_t* seed_key = nullptr;  // NvFp4Options::seed_key's words (on the cast's device)
  const int32_t* origin = nullptr;     // NvFp4Options::origin (on the cast's device); null: 0, 0
  // NvFp4Options::amax and columnwise_amax (on the cast's device): the per-tensor amaxes.
  const float* amax = nullptr;
  const float* columnwise_amax = nullptr;
  // nvfp4_amax: if set, the cast only writes each copy's own per-tensor amax here ([2], on the
  // cast's device; copy 1 computed only with rht_columnwise, else copy 0's) and encodes nothing.
  float* amax_out = nullptr;
  NvFp4CopyOut copies[2];

  QMESH_HOST_DEVICE int64_t copy_rows(int copy) const { return copy == 0 ? rows : cols; }
  QMESH_HOST_DEVICE int64_t copy_cols(int copy) const { return copy == 0 ? cols : rows; }
  QMESH_HOST_DEVICE bool rht(int copy) const { return copy == 1 && rht_columnwise; }
  // Whether the cast runs the steps of `copy`.
  QMESH_HOST_DEVICE bool has_copy(int copy) const {
    return amax_out ? copy == 0 || rht_columnwise : copies[copy].data != nullptr;
  }
  // The stochastic rounding inputs (read where the cast runs).
  QMESH_HOST_DEVICE NvFp4Rounding rounding() const {
    return {seed_key ? (uint64_t(seed_key[0]) << 32) | seed_key[1] : seed, origin ? origin[0] : 0,
            origin ? origin[1] : 0};
  }
  // The row-major index in the whole tensor's copy `copy` of element (i, j) of x's copy.
  QMESH_HOST_DEVICE uint64_t whole_index(int copy, int64_t i, int64_t j,
                                         const NvFp4Rounding& r) const {
    return copy == 0 ? uint64_t((r.row0 + i) * whole_cols + r.col0 + j)
                     : uint64_t((r.col0 + i) * whole_rows + r.row0 + j);
  }
  // The per-tensor amax of a copy: the given one, else `own` (the max of its block amaxes).
  QMESH_HOST_DEVICE float tensor_amax(int copy, float own) const {
    const float* given = rht(copy) ? columnwise_amax : amax;
    return given ? *given : own;
  }
};

namespace nvfp4 {

// The 16 values of block kb of row i of `copy` as quantized (transformed when job.rht(copy));
// load(k) gives x's row-major element k as fp32.
template <class Load>
QMESH_HOST_DEVICE inline void load_block(const NvFp4CastJob& job, const Load& load, int copy,
                                         int64_t i, int64_t kb, float (&v)[kBlock]) {
  float raw[kBlock];
  for (int k = 0; k < kBlock; ++k) {
    const int64_t j = kb * kBlock + k;
    raw[k] = load(copy == 0 ? i * job.cols + j : j * job.cols + i);
  }
  if (job.rht(copy)) {
    hadamard16(raw, job.rht_signs, false, v);
  } else {
    for (int k = 0; k < kBlock; ++k) v[k] = raw[k];
  }
}

// max |v| as bits (a NaN sorts above infinity, so it propagates).
QMESH_HOST_DEVICE inline uint32_t amax_bits(const float (&v)[kBlock]) {
  uint32_t m = 0;
  for (int k = 0; k < kBlock; ++k) {
    const uint32_t a = bits_of(v[k]) & 0x7FFFFFFFu;
    m = a > m ? a : m;
  }
  return m;
}

// Encodes block kb of row i of `copy` (values v, block or tile amax `amax`, per-tensor encode
// scale `global_encode` and its inverse `global_decode`, stochastic rounding inputs `r` =
// job.rounding()) into the copy's codes and scale.
QMESH_HOST_DEVICE inline void encode_block(const NvFp4CastJob& job, int copy, int64_t i, int64_t kb,
                                           const float (&v)[kBlock], float amax,
                                           float global_encode, float global_decode,
                                           const NvFp4Rounding& r) {
  const NvFp4CopyOut& out = job.copies[copy];
  const int64_t cols = job.copy_cols(copy);
  const uint8_t scale = block_scale_code(amax, global_encode);
  const float factor = block_encode_factor(scale, global_decode);
  const bool sr = job.stochastic_rounding;
  const uint64_t first = sr ? job.whole_index(copy, i, kb * kBlock, r) : 0u;
  uint8_t* packed = out.data + i * (cols / 2) + kb * (kBlock / 2);
  for (int k = 0; k < kBlock; k += 2) {
    const uint32_t lo = sr ? rounding_bits(r.seed, copy, first + k) : 0u;
    const uint32_t hi = sr ? rounding_bits(r.seed, copy, first + k + 1) : 0u;
    packed[k / 2] =
        uint8_t(encode_e2m1(v[k] * factor, sr, lo) | (encode_e2m1(v[k + 1] * factor, sr, hi) << 4));
  }
  out.scale[i * (cols / kBlock) + kb] = scale;
}

// Element j of a packed row with its block scale `scale` and per-tensor decode scale; a NaN
// (a NaN decode scale, stored_decode_scale) is the canonical NaN on both backends.
QMESH_HOST_DEVICE inline float decode_element(const uint8_t* packed_row, const uint8_t* scale_row,
                                              int64_t j, float global_decode) {
  const uint8_t code = uint8_t((packed_row[j / 2] >> ((j & 1) * 4)) & 0xFu);
  return gelu_detail::canonical_nan((decode_e2m1(code) * decode_e4m3_scale(scale_row[j / kBlock])) *
                                    global_decode);
}

}  // namespace nvfp4
}  // namespace qmesh::detail
