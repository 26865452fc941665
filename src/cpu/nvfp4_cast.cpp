// CPU backend of the NVFP4 casts: the host twin of cuda/nvfp4_cast.cu. Both run the steps of
// ops/nvfp4_cast_job.h in the same order per copy: block amaxes, the per-tensor amax (their
// max; all an amax-only job computes), tile amaxes with 16x16 tiles, then scales and codes; every
// value comes from the shared rules of ops/nvfp4_rules.h, so the bits match the kernels'. Rows run
// on separate threads.
#include "cpu/nvfp4_cast.h"

#include <algorithm>
#include <vector>

#include "core/element_traits.h"
#include "cpu/parallel.h"
#include "qmesh/error.h"
#include "qmesh/float16.h"

namespace qmesh::detail::cpu {

namespace {

using nvfp4::kBlock;

// Rows of a copy below this many elements stay on one thread.
constexpr int64_t kGrainElements = int64_t{1} << 15;

template <class Load>
void cast_copy(const NvFp4CastJob& job, int copy) {
  using T = typename Load::type;
  const T* in = static_cast<const T*>(job.in);
  const auto load = [in](int64_t k) { return Load::apply(in[k]); };
  const int64_t rows = job.copy_rows(copy), blocks = job.copy_cols(copy) / kBlock;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / job.copy_cols(copy));
  std::vector<uint32_t> amax(static_cast<size_t>(rows * blocks));
  parallel_for(rows, grain, [&](int64_t begin, int64_t end, int) {
    float v[kBlock];
    for (int64_t i = begin; i < end; ++i)
      for (int64_t kb = 0; kb < blocks; ++kb) {
        nvfp4::load_block(job, load, copy, i, kb, v);
        amax[i * blocks + kb] = nvfp4::amax_bits(v);
      }
  });
  const uint32_t global = *std::max_element(amax.begin(), amax.end());
  if (job.amax_out) {
    job.amax_out[copy] = nvfp4::float_of(global);
    return;
  }
  if (job.tiles_2d)
    for (int64_t i0 = 0; i0 < rows; i0 += kBlock)
      for (int64_t kb = 0; kb < blocks; ++kb) {
        uint32_t tile = 0;
        for (int64_t i = i0; i < i0 + kBlock; ++i) tile = std::max(tile, amax[i * blocks + kb]);
        for (int64_t i = i0; i < i0 + kBlock; ++i) amax[i * blocks + kb] = tile;
      }
  const float tensor_amax = job.tensor_amax(copy, nvfp4::float_of(global));
  const float global_encode = nvfp4::global_encode_scale(tensor_amax);
  const float global_decode = 1.0f / global_encode;
  *job.copies[copy].scale_inv = nvfp4::stored_decode_scale(tensor_amax, global_encode);
  const NvFp4Rounding rounding = job.rounding();
  parallel_for(rows, grain, [&](int64_t begin, int64_t end, int) {
    float v[kBlock];
    for (int64_t i = begin; i < end; ++i)
      for (int64_t kb = 0; kb < blocks; ++kb) {
        nvfp4::load_block(job, load, copy, i, kb, v);
        nvfp4::encode_block(job, copy, i, kb, v, nvfp4::float_of(amax[i * blocks + kb]),
                            global_encode, global_decode, rounding);
      }
  });
}

template <class Load>
void cast(const NvFp4CastJob& job) {
  for (int copy = 0; copy < 2; ++copy)
    if (job.has_copy(copy)) cast_copy<Load>(job, copy);
  if (job.amax_out && !job.rht_columnwise) job.amax_out[1] = job.amax_out[0];
}

}  // namespace

void nvfp4_cast(const NvFp4CastJob& job) {
  switch (job.in_dtype) {
    case DType::kFloat32:
      return cast<LoadFp32>(job);
    case DType::kBFloat16:
      return cast<LoadBf16>(job);
    case DType::kFloat16:
      return cast<LoadFp16>(job);
    default:
      QMESH_THROW("NVFP4 cast input must be fp32, bf16 or fp16, got ", dtype_name(job.in_dtype));
  }
}

void nvfp4_dequantize(const uint8_t* data, const uint8_t* scale, const float* scale_inv,
                      int64_t rows, int64_t cols, void* out, DType out_dtype) {
  const float global_decode = *scale_inv;
  parallel_for(rows, std::max<int64_t>(1, kGrainElements / cols),
               [&](int64_t begin, int64_t end, int) {
                 std::vector<float> row(static_cast<size_t>(cols));
                 for (int64_t i = begin; i < end; ++i) {
                   for (int64_t j = 0; j < cols; ++j)
                     row[j] = nvfp4::decode_element(data + i * (cols / 2),
                                                    scale + i * (cols / kBlock), j, global_decode);
                   if (out_dtype == DType::kFloat32)
                     std::copy(row.begin(), row.end(), static_cast<float*>(out) + i * cols);
                   else if (out_dtype == DType::kBFloat16)
                     fp32_to_bf16(row.data(), static_cast<uint16_t*>(out) + i * cols, size_t(cols));
                   else
                     fp32_to_fp16(row.data(), static_cast<uint16_t*>(out) + i * cols, size_t(cols));
                 }
               });
}

}  // namespace qmesh::detail::cpu
