// Host twin of the CUDA norm kernel (cuda/norm.cu): the same sums in the same order (lanes of
// kNormLanes columns, a pairwise tree within each group of 32 lanes as the warp shuffles add,
// the group sums in order as block_sum adds them) and the per-element arithmetic of
// ops/norm_job.h, compiled without contraction (src/cpu/sources.cmake), so that y, the
// statistics, the codes and the amax equal the device's bit for bit.
#include "cpu/norm.h"

#include <algorithm>
#include <bit>
#include <vector>

#include "cpu/parallel.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"

namespace qmesh::detail::cpu {

namespace {

constexpr int kWarp = 32;
constexpr int64_t kGrainElements = int64_t{1} << 16;

// The block sum of the CUDA kernel over its lanes' partial sums (consumed).
float lane_total(float (&lanes)[kNormLanes]) {
  float total = 0.0f;
  for (int w = 0; w < kNormLanes; w += kWarp) {
    float* v = lanes + w;
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
      for (int i = 0; i < offset; ++i) v[i] = v[i] + v[i + offset];
    total += v[0];
  }
  return total;
}

// sum over the row of f(x[c]), in the device's order.
template <class F>
float row_sum(const float* x, int64_t cols, F&& f) {
  float lanes[kNormLanes] = {};
  for (int64_t c = 0; c < cols; ++c)
    lanes[c % kNormLanes] = gelu_detail::add(lanes[c % kNormLanes], f(x[c]));
  return lane_total(lanes);
}

uint8_t encode(float v, DType fp8) {
  return fp8 == DType::kFloat8E4M3 ? float_to_e4m3(v) : float_to_e5m2(v);
}

// Rows [begin, end): statistics, y, codes; returns the max |y| bits.
uint32_t norm_rows(const NormJob& job, int64_t begin, int64_t end) {
  const int64_t cols = job.cols;
  const bool rms = job.beta == nullptr;
  const float scale = job.out ? *job.scale : 0.0f;
  std::vector<float> x(static_cast<size_t>(cols));
  uint32_t amax = 0;
  for (int64_t r = begin; r < end; ++r) {
    if (job.x_dtype == DType::kBFloat16)
      bf16_to_fp32(static_cast<const uint16_t*>(job.x) + r * cols, x.data(), size_t(cols));
    else
      std::copy_n(static_cast<const float*>(job.x) + r * cols, cols, x.data());
    using namespace gelu_detail;
    const float m =
        rms ? 0.0f : div(row_sum(x.data(), cols, [](float v) { return v; }), float(cols));
    const float sq = row_sum(x.data(), cols, [&](float v) {
      const float d = rms ? v : sub(v, m);
      return mul(d, d);
    });
    const float rs = norm_rstd(sq, cols, job.eps);
    const float m_out = canonical_nan(m), rs_out = canonical_nan(rs);
    for (int64_t c = 0; c < cols; ++c) {
      const float g = job.zero_centered_gamma ? add(job.gamma[c], 1.0f) : job.gamma[c];
      float v = canonical_nan(normalize(x[c], m, rs, g, rms ? 0.0f : job.beta[c], rms));
      const int64_t i = r * cols + c;
      if (job.y_dtype == DType::kBFloat16) {
        const uint16_t h = float_to_bf16(v);
        v = bf16_to_float(h);
        if (job.y) static_cast<uint16_t*>(job.y)[i] = h;
      } else if (job.y) {
        static_cast<float*>(job.y)[i] = v;
      }
      amax = std::max(amax, std::bit_cast<uint32_t>(v) & 0x7FFFFFFFu);
      if (job.out) {
        const uint8_t code = encode(mul(v, scale), job.fp8);
        job.out[i] = code;
        if (job.out_t) job.out_t[c * job.rows + r] = code;
      }
    }
    if (job.mean) job.mean[r] = m_out;
    if (job.rstd) job.rstd[r] = rs_out;
  }
  return amax;
}

}  // namespace

void norm_forward(const NormJob& job) {
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(job.cols, 1));
  std::vector<uint32_t> partial(parallel_chunks(job.rows, grain), 0);
  parallel_for(job.rows, grain, [&](int64_t begin, int64_t end, int chunk) {
    partial[chunk] = norm_rows(job, begin, end);
  });
  if (job.amax == nullptr) return;
  uint32_t amax = *std::max_element(partial.begin(), partial.end());
  if (job.out) amax = std::max(amax, std::bit_cast<uint32_t>(*job.amax));
  *job.amax = std::bit_cast<float>(amax);
  if (job.out) *job.scale_inv = 1.0f / *job.scale;
}

}  // namespace qmesh::detail::cpu
