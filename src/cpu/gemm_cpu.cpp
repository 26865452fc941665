// Host GEMM. The GEMM runs as a few large sgemm calls over row blocks of D and K panels of
// the operands:
//   for each block of mb rows of D:            (mb = M unless an fp32 staging D is too big)
//     for each panel of kc columns of K:        (kc = K unless the widened panels are too big)
//       widen the A and B panels to fp32 (FP8 codes are widened without their scale_inv)
//       sgemm: D_block (+)= (alpha · scale_inv_a · scale_inv_b) · A_panel · B_panel
//     epilogue pass over the block's rows
// Products of FP8 codes are exact in fp32, so folding both scale_inv into alpha changes only
// the rounding of one multiplication, as on the GPU, where cuBLASLt applies the scales in
// its epilogue too. Block-scaled operands (whose scales differ along K) are dequantized
// instead: every element widened to code · its block's scale_inv in fp32.
#include "cpu/gemm_cpu.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/simd.h"
#include "cpu/gelu.h"
#include "cpu/parallel.h"
#include "qmesh/buffer.h"
#include "qmesh/config.h"
#include "qmesh/error.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "qmesh/param.h"
#if QMESH_WITH_BLAS
#include <cblas.h>
#endif

namespace qmesh::detail {

namespace {

// Bytes of widened panels and fp32 staging that one host GEMM may use
// (QMESH_GEMM_HOST_PANEL_MIB); beyond it the GEMM is split into K panels and row blocks. The
// default 64 MiB keeps sgemm calls large (K panels of >= 2048 at M = N = 4096) while bounding
// the extra memory.
size_t panel_budget_bytes() {
  const int64_t mib = param_int("GEMM_HOST_PANEL_MIB", 64);
  QMESH_CHECK(mib >= 1, "QMESH_GEMM_HOST_PANEL_MIB must be >= 1, got ", mib);
  return size_t(mib) << 20;
}
constexpr int64_t kPanelGranule = 256;  // K panels are multiples of this (OpenBLAS's K block)
constexpr size_t kAlign = 64;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// How one host GEMM is split and where its scratch lives in the workspace.
struct HostPlan {
  int64_t mb = 0;  // rows of D per block
  int64_t kc = 0;  // K per panel
  bool widen_a = false;
  bool widen_b = false;
  bool stage_d = false;  // D is not fp32: sgemm writes an fp32 staging block
  int threads = 1;       // threads of the widening and epilogue passes (QMESH_CPU_THREADS)
  size_t stage_offset = 0, a_offset = 0, b_offset = 0, row_offset = 0, bytes = 0;
};

// Below this many elements a pass runs on the calling thread (a thread start costs ~20 us).
constexpr int64_t kMinElementsPerThread = int64_t(1) << 16;

// Rows per thread for a pass over rows of `row_elements` elements each.
int64_t row_grain(int64_t row_elements) {
  return std::max<int64_t>(1, kMinElementsPerThread / std::max<int64_t>(row_elements, 1));
}

HostPlan plan_host_gemm(const CanonicalGemm& c) {
  HostPlan p;
  p.widen_a = c.a.dtype != DType::kFloat32;
  p.widen_b = c.b.dtype != DType::kFloat32;
  p.stage_d = c.d_dtype != DType::kFloat32;
  const auto budget = static_cast<int64_t>(panel_budget_bytes() / sizeof(float));
  p.mb = c.m;
  if (p.stage_d) p.mb = std::clamp<int64_t>(budget / 2 / c.n, 1, c.m);
  const int64_t per_k = (p.widen_a ? p.mb : 0) + (p.widen_b ? c.n : 0);
  p.kc = c.k;
  if (per_k > 0 && per_k * c.k > budget / 2) {
    p.kc = std::max<int64_t>(kPanelGranule, budget / 2 / per_k / kPanelGranule * kPanelGranule);
    p.kc = std::min(p.kc, c.k);
  }
  size_t offset = 0;
  p.stage_offset = offset;
  if (p.stage_d) offset += aligned(sizeof(float) * size_t(p.mb) * size_t(c.n));
  p.a_offset = offset;
  if (p.widen_a) offset += aligned(sizeof(float) * size_t(p.mb) * size_t(p.kc));
  p.b_offset = offset;
  if (p.widen_b) offset += aligned(sizeof(float) * size_t(c.n) * size_t(p.kc));
  // One fp32 row of N per thread for the epilogue pass (D's old row or aux, widened).
  p.threads = cpu::cpu_threads();
  p.row_offset = offset;
  offset += size_t(p.threads) * aligned(sizeof(float) * size_t(c.n));
  p.bytes = offset;
  return p;
}

// Widens n elements of a GEMM dtype to fp32 (FP8 without its scale).
void widen(const void* in, DType dtype, float* out, size_t n) {
  switch (dtype) {
    case DType::kFloat32:
      std::copy_n(static_cast<const float*>(in), n, out);
      return;
    case DType::kBFloat16:
      bf16_to_fp32(static_cast<const uint16_t*>(in), out, n);
      return;
    case DType::kFloat16:
      fp16_to_fp32(static_cast<const uint16_t*>(in), out, n);
      return;
    default:
      fp8_to_fp32(static_cast<const uint8_t*>(in), out, n, dtype, 1.0f);
  }
}

// A block of a stored operand as sgemm reads it: a pointer and its leading dimension.
struct Panel {
  const float* data;
  int64_t ld;
};

// Columns [c0, c0 + nc) of row r of a block-scaled operand, dequantized: code · scale_inv of
// each element's block.
void dequantize_row(const GemmMatrix& m, int64_t r, int64_t c0, int64_t nc, float* out) {
  const auto* codes = static_cast<const uint8_t*>(m.data) + size_t(r) * size_t(m.cols);
  for (int64_t c = c0; c < c0 + nc;) {
    const int64_t end = std::min(c0 + nc, (c / kScaleBlock + 1) * kScaleBlock);
    fp8_to_fp32(codes + c, out + (c - c0), size_t(end - c), m.dtype, m.block_scale_inv(r, c));
    c = end;
  }
}

// Rows [r0, r0 + nr) × columns [c0, c0 + nc) of a stored operand: in place when it is fp32,
// else widened (block-scaled: dequantized) into `scratch` (nr × nc).
Panel load_block(const GemmMatrix& m, int64_t r0, int64_t nr, int64_t c0, int64_t nc,
                 float* scratch) {
  const size_t esize = dtype_size(m.dtype);
  const auto* base = static_cast<const char*>(m.data);
  if (m.dtype == DType::kFloat32)
    return {reinterpret_cast<const float*>(base) + r0 * m.cols + c0, m.cols};
  cpu::parallel_for(nr, row_grain(nc), [&](int64_t begin, int64_t end, int) {
    for (int64_t r = begin; r < end; ++r) {
      if (m.block_scaled())
        dequantize_row(m, r0 + r, c0, nc, scratch + r * nc);
      else
        widen(base + (size_t(r0 + r) * size_t(m.cols) + size_t(c0)) * esize, m.dtype,
              scratch + r * nc, size_t(nc));
    }
  });
  return {scratch, nc};
}

// The per-tensor factor folded into alpha (1 for plain and block-scaled operands, whose
// panels are dequantized).
float host_scale_inv(const GemmMatrix& m) {
  return m.scale_inv && !m.block_scaled() ? *m.scale_inv : 1.0f;
}

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, Panel a,
           Panel b, float beta, float* c, int64_t ldc) {
#if QMESH_WITH_BLAS
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, int(m), int(n), int(k), alpha, a.data, int(a.ld),
              b.data, int(b.ld), beta, c, int(ldc));
#else
  // Built without OpenBLAS: a straightforward loop (correct, much slower), so that the host
  // backend still works; the inner loop runs along D's row.
  for (int64_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] = beta == 0.0f ? 0.0f : row[j] * beta;
    for (int64_t p = 0; p < k; ++p) {
      const float av = alpha * (trans_a ? a.data[p * a.ld + i] : a.data[i * a.ld + p]);
      for (int64_t j = 0; j < n; ++j)
        row[j] += av * (trans_b ? b.data[j * b.ld + p] : b.data[p * b.ld + j]);
    }
  }
#endif
}

// ---- epilogue math (branch-free so that the row loops vectorize) ----------------------

QMESH_SIMD_CLONES void add_rows(float* r, const float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) r[j] += x[j];
}
// max(m, a) that lets a NaN through: a NaN result makes amax NaN, so that the scaling update
// sees a non-finite amax and keeps the previous scale.
inline float nan_max(float m, float a) { return (a > m || a != a) ? a : m; }

QMESH_SIMD_CLONES float amax_row(const float* r, int64_t n, float amax) {
  for (int64_t j = 0; j < n; ++j) amax = nan_max(amax, std::fabs(r[j]));
  return amax;
}

// Stores n fp32 values in a plain dtype.
void narrow(const float* in, DType dtype, void* out, size_t n) {
  switch (dtype) {
    case DType::kFloat32:
      if (out != in) std::copy_n(in, n, static_cast<float*>(out));
      return;
    case DType::kBFloat16:
      fp32_to_bf16(in, static_cast<uint16_t*>(out), n);
      return;
    default:
      fp32_to_fp16(in, static_cast<uint16_t*>(out), n);
  }
}

bool needs_epilogue_pass(const CanonicalGemm& c) {
  return c.d_dtype != DType::kFloat32 ||
         (c.epilogue != GemmEpilogue::kNone && c.epilogue != GemmEpilogue::kBiasGrad);
}

// The epilogue over rows [m0, m0 + rows) of D; `acc` holds their fp32 GEMM results (the
// staging block, or D itself when D is fp32). Returns the block's amax.
float epilogue_pass(const CanonicalGemm& c, int64_t m0, int64_t rows, float* acc,
                    const std::vector<float>& bias, float* scratch_row) {
  const int64_t n = c.n;
  const size_t d_esize = dtype_size(c.d_dtype);
  const size_t aux_esize = dtype_size(c.aux_dtype);
  const bool stage = c.d_dtype != DType::kFloat32;
  const float d_scale = c.d_scale ? *c.d_scale : 1.0f;
  float amax = 0.0f;
  for (int64_t i = 0; i < rows; ++i) {
    float* r = acc + i * n;
    void* d_row = static_cast<char*>(c.d) + size_t(m0 + i) * size_t(n) * d_esize;
    void* aux_row =
        c.aux ? static_cast<char*>(c.aux) + size_t(m0 + i) * size_t(n) * aux_esize : nullptr;
    if (stage && c.beta != 0.0f) {  // kAccumulate into bf16/fp16 (fp32 D: done by sgemm)
      widen(d_row, c.d_dtype, scratch_row, size_t(n));
      add_rows(r, scratch_row, n);
    }
    switch (c.epilogue) {
      case GemmEpilogue::kBias:
        add_rows(r, bias.data(), n);
        break;
      case GemmEpilogue::kGelu:
        gelu_inplace(r, n);
        break;
      case GemmEpilogue::kBiasGeluAux:
        add_rows(r, bias.data(), n);
        narrow(r, c.aux_dtype, aux_row, size_t(n));
        gelu_inplace(r, n);
        break;
      case GemmEpilogue::kDGelu:
        widen(aux_row, c.aux_dtype, scratch_row, size_t(n));
        dgelu_mul_inplace(r, scratch_row, n);
        break;
      case GemmEpilogue::kNone:
      case GemmEpilogue::kBiasGrad:
        break;
    }
    if (is_fp8(c.d_dtype)) {
      amax = amax_row(r, n, amax);
      fp32_to_fp8(r, static_cast<uint8_t*>(d_row), size_t(n), c.d_dtype, d_scale);
    } else {
      narrow(r, c.d_dtype, d_row, size_t(n));
    }
  }
  return amax;
}

// dbias[i] += sum over the panel's K of op(A)[i, k], from a panel in its stored orientation.
void add_row_sums(Panel a, bool k_contiguous, int64_t rows, int64_t kc, double* dbias) {
  if (k_contiguous) {
    for (int64_t i = 0; i < rows; ++i) {
      double s = 0.0;
      for (int64_t p = 0; p < kc; ++p) s += a.data[i * a.ld + p];
      dbias[i] += s;
    }
  } else {
    for (int64_t p = 0; p < kc; ++p)
      for (int64_t i = 0; i < rows; ++i) dbias[i] += a.data[p * a.ld + i];
  }
}

std::vector<float> widened_bias(const CanonicalGemm& c) {
  std::vector<float> bias;
  if (c.epilogue == GemmEpilogue::kBias || c.epilogue == GemmEpilogue::kBiasGeluAux) {
    bias.resize(size_t(c.n));
    widen(c.bias, c.bias_dtype, bias.data(), bias.size());
  }
  return bias;
}

}  // namespace

size_t host_gemm_workspace_size(const CanonicalGemm& c) { return plan_host_gemm(c).bytes; }

void host_gemm(const CanonicalGemm& c, void* workspace, size_t workspace_bytes) {
  if (c.batch > 1) {  // the elements one after another, each as the 2-D GEMM (same plan)
    for (int64_t i = 0; i < c.batch; ++i)
      host_gemm(batch_element(c, i), workspace, workspace_bytes);
    return;
  }
  const HostPlan plan = plan_host_gemm(c);
  QMESH_CHECK(!workspace || workspace_bytes >= plan.bytes, "the GEMM workspace has ",
              workspace_bytes, " bytes but the host GEMM now needs ", plan.bytes,
              " (QMESH_GEMM_HOST_PANEL_MIB or QMESH_CPU_THREADS changed since "
              "Gemm::initialize): initialize again with a new workspace");
  if (!workspace) {
    thread_local Buffer cached;
    if (cached.size() < plan.bytes) cached = Buffer(plan.bytes, Device::host());
    workspace = cached.data();
  }
  auto* ws = static_cast<char*>(workspace);
  auto* stage = reinterpret_cast<float*>(ws + plan.stage_offset);
  auto* a_scratch = reinterpret_cast<float*>(ws + plan.a_offset);
  auto* b_scratch = reinterpret_cast<float*>(ws + plan.b_offset);
  auto* row_scratch = reinterpret_cast<float*>(ws + plan.row_offset);

  const float alpha = c.alpha * host_scale_inv(c.a) * host_scale_inv(c.b);
  const std::vector<float> bias = widened_bias(c);
  const bool bias_grad = c.epilogue == GemmEpilogue::kBiasGrad;
  std::vector<double> dbias(bias_grad ? size_t(c.m) : 0, 0.0);
  float amax = 0.0f;

  for (int64_t m0 = 0; m0 < c.m; m0 += plan.mb) {
    const int64_t mb = std::min(plan.mb, c.m - m0);
    float* out = plan.stage_d ? stage : static_cast<float*>(c.d) + m0 * c.n;
    for (int64_t k0 = 0; k0 < c.k; k0 += plan.kc) {
      const int64_t kc = std::min(plan.kc, c.k - k0);
      const Panel a = c.a.k_contiguous ? load_block(c.a, m0, mb, k0, kc, a_scratch)
                                       : load_block(c.a, k0, kc, m0, mb, a_scratch);
      const Panel b = c.b.k_contiguous ? load_block(c.b, 0, c.n, k0, kc, b_scratch)
                                       : load_block(c.b, k0, kc, 0, c.n, b_scratch);
      const float beta = k0 > 0 ? 1.0f : (plan.stage_d ? 0.0f : c.beta);
      sgemm(!c.a.k_contiguous, c.b.k_contiguous, mb, c.n, kc, alpha, a, b, beta, out, c.n);
      if (bias_grad) add_row_sums(a, c.a.k_contiguous, mb, kc, dbias.data() + m0);
    }
    if (needs_epilogue_pass(c)) {
      std::vector<float> amaxes(size_t(plan.threads), 0.0f);
      const size_t row_stride = aligned(sizeof(float) * size_t(c.n)) / sizeof(float);
      cpu::parallel_for(mb, row_grain(c.n), [&](int64_t begin, int64_t end, int thread) {
        amaxes[size_t(thread)] = epilogue_pass(c, m0 + begin, end - begin, out + begin * c.n, bias,
                                               row_scratch + size_t(thread) * row_stride);
      });
      for (float a : amaxes) amax = nan_max(amax, a);
    }
  }

  if (bias_grad) {
    const float scale_inv = host_scale_inv(c.a);
    std::vector<float> sums(dbias.size());
    for (size_t i = 0; i < sums.size(); ++i) sums[i] = float(dbias[i] * scale_inv);
    narrow(sums.data(), c.bias_dtype, c.bias, sums.size());
  }
  if (c.d_amax) *c.d_amax = amax;
}

}  // namespace qmesh::detail
