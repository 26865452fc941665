// NVFP4 quantization (docs/design/nvfp4.md; the numerics in docs/numerics.md "NVFP4"): E2M1
// codes with an E4M3 scale per 16 elements (or per 16x16 tile) and an fp32 per-tensor scale,
// optional stochastic rounding and a random Hadamard transform of the columnwise copy.
#pragma once

#include <cstdint>

#include "qmesh/export.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// How one nvfp4_quantize call rounds.
struct NvFp4Options {
  // Round the codes stochastically (unbiased; gradients) with the bits of (seed, element):
  // docs/design/nvfp4.md. Otherwise to nearest even.
  bool stochastic_rounding = false;
  uint64_t seed = 0;
  // If not empty, replaces `seed`: int32 [2] key words (jax.random key data) on x's device,
  // read by the cast itself (no host synchronization): seed = uint32(key[0]) << 32 | key[1].
  TensorView seed_key;
  // Quantize 16x16 tiles (one scale per tile, weights) instead of 1x16 blocks.
  bool tiles_2d = false;
  // Apply the random Hadamard transform with sign mask `rht_signs` to the 16-element blocks of
  // the columnwise copy (the wgrad GEMM operands; both operands need the same signs).
  bool rht = false;
  uint16_t rht_signs = 0;
  // Quantizing a shard of a whole tensor as its slice of the whole tensor's quantization
  // (docs/design/nvfp4.md "Sharding"). If not empty: fp32 [1] on x's device, the amax that sets
  // the per-tensor scale of the rowwise copy and, without rht, of the columnwise copy instead of
  // x's own (the whole tensor's amax; at least x's own, else elements saturate).
  TensorView amax;
  // If not empty (only with rht and a columnwise copy, and then needed whenever `amax` is
  // given): fp32 [1] on x's device, the amax of the whole tensor's transformed columnwise copy
  // (nvfp4_amax's second value, all-reduced), which sets that copy's per-tensor scale.
  TensorView columnwise_amax;
  // If not empty: int32 [2] on x's device, read by the cast itself: (row, column) of x[0, 0] in
  // the whole [whole_rows, whole_cols] tensor, each a multiple of 16 with x inside the whole.
  // Stochastic rounding then draws the bits of each element's index in the whole tensor's copy
  // (rowwise (row + i) * whole_cols + column + j; columnwise (column + j) * whole_rows + row +
  // i), so that a shard rounds as its slice of the whole. Empty: x is the whole tensor. A host
  // origin is checked; a device origin's values are the caller's to get right.
  TensorView origin;
  int64_t whole_rows = 0;  // with origin: the whole tensor's shape (multiples of 16)
  int64_t whole_cols = 0;
};

// The switches of TransformerEngine's NVFP4 recipe.
struct NvFp4Config {
  bool disable_rht = false;
  bool disable_stochastic_rounding = false;
  bool disable_2d_quantization = false;
};

// The role of a GEMM operand, which decides its NvFp4Options under the recipe.
enum class NvFp4Role : uint8_t {
  kInput,     // activations: 1x16 blocks, nearest even, RHT on the columnwise copy
  kWeight,    // 16x16 tiles, nearest even, no RHT
  kGradient,  // output gradients: 1x16 blocks, stochastic rounding, RHT on the columnwise copy
};

// The sign mask of the random Hadamard transform drawn from `seed` (16 bits of splitmix64).
QMESH_API uint16_t nvfp4_rht_signs(uint64_t seed);

// The options of `role` under `config`: the table above, less what config disables. `seed`
// feeds stochastic rounding (draw a fresh one per step); `rht_seed` the RHT signs (shared by
// the two wgrad operands).
QMESH_API NvFp4Options nvfp4_options(const NvFp4Config& config, NvFp4Role role, uint64_t seed,
                                     uint64_t rht_seed);

// x is read as its row-major [rows, cols] view (fp32, bf16 or fp16; rows and cols multiples of
// 16, else an Error: pad first) and quantized into out (same device; its columnwise copy, if
// present, from x's transpose). Per copy: the per-tensor amax (NaN-propagating; of the
// transformed values with RHT), then per block or tile the scale and the codes, by the rule of
// docs/numerics.md "NVFP4". RHT with 16x16 tiles is refused (weights take no RHT). Host:
// blocking, multi-threaded. CUDA: asynchronous on `stream`. Both give the same bits for the
// same options, stochastic rounding included.
QMESH_API void nvfp4_quantize(const TensorView& x, const NvFp4TensorView& out,
                              const NvFp4Options& options, Stream stream = {});

// amax = fp32 [2] on x's device: the per-tensor amaxes nvfp4_quantize takes of x's own values for
// the rowwise copy and the columnwise copy (of the transformed values with options.rht, by the
// cast's own arithmetic; without it the same value twice), NaN-propagating. Reads only rht and
// rht_signs of `options`. A sharded cast all-reduces (max) these over the shards and passes them
// as NvFp4Options::amax and columnwise_amax. Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void nvfp4_amax(const TensorView& x, const TensorView& amax, const NvFp4Options& options,
                          Stream stream = {});

// out = (e2m1(code) * e4m3(scale of its block)) * scale_inv, rounded to out's dtype (fp32,
// bf16 or fp16, read row-major): of the rowwise copy ([rows, cols] elements), or with
// `columnwise` of the columnwise copy ([cols, rows]; in the transformed basis if it was
// quantized with RHT). Host: blocking. CUDA: asynchronous on `stream`.
QMESH_API void nvfp4_dequantize(const NvFp4TensorView& in, const TensorView& out,
                                bool columnwise = false, Stream stream = {});

// The random Hadamard transform of every 16 consecutive elements of an fp32 host array of n
// elements (n a multiple of 16), or with `inverse` its inverse (the transpose): the exact
// operation nvfp4_quantize applies (docs/design/nvfp4.md).
QMESH_API void nvfp4_hadamard16(const float* in, float* out, int64_t n, uint16_t signs,
                                bool inverse);

}  // namespace qmesh
