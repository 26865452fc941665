#include "ops/gemm_algo_key.h"

#include "qmesh/error.h"

namespace qmesh::detail {

uint32_t pointer_alignment(const void* p) {
  uint32_t a = 256;
  while (reinterpret_cast<uintptr_t>(p) % a != 0) a /= 2;
  return a;
}

std::array<uint32_t, 4> gemm_operand_alignments(const CanonicalGemm& c) {
  const void* c_ptr = is_fp8(c.d_dtype) ? nullptr : c.d;
  return {pointer_alignment(c.b.data), pointer_alignment(c.a.data), pointer_alignment(c_ptr),
          pointer_alignment(c.d)};
}

GemmProblem gemm_problem(const CanonicalGemm& c) {
  GemmProblem p;
  p.device = c.device.index;
  p.cm = c.cm;
  p.a = c.b.dtype;
  p.b = c.a.dtype;
  p.a_scaling = c.b.scaling;
  p.b_scaling = c.a.scaling;
  p.d = c.d_dtype;
  p.beta = c.beta;
  p.device_alpha_beta = c.device_alpha_beta != nullptr;
  p.epilogue = c.epilogue;
  p.bias = c.bias_dtype;
  p.aux = c.aux_dtype;
  p.accumulation = c.accumulation;
  p.amax_d = c.d_amax != nullptr;
  const std::array<uint32_t, 4> align = gemm_operand_alignments(c);
  p.alignments = {
      align[0], align[1], align[2], align[3], pointer_alignment(c.bias), pointer_alignment(c.aux)};
  const float* scalars[] = {c.b.scale_inv, c.a.scale_inv, c.d_scale, c.d_amax};
  for (uint32_t i = 0; i < 4; ++i)
    if (pointer_alignment(scalars[i]) < kCublasLtScalarAlignment) p.staged_scalars |= 1u << i;
  return p;
}

std::string gemm_algo_key(const CanonicalGemm& c, std::string_view device_name,
                          size_t library_version) {
  const GemmProblem p = gemm_problem(c);
  const std::array<uint32_t, 6>& align = p.alignments;
  return concat(device_name, "|cublasLt ", library_version, "|m", p.cm.m, " n", p.cm.n, " k",
                p.cm.k, "|", p.cm.trans_a ? 'T' : 'N', p.cm.trans_b ? 'T' : 'N', " lda", p.cm.lda,
                " ldb", p.cm.ldb, "|", dtype_name(p.a), "x", dtype_name(p.b), "->", dtype_name(p.d),
                "|scale", int(p.a_scaling), "x", int(p.b_scaling), "|beta", p.beta, "|epi",
                int(p.epilogue), " bias ", dtype_name(p.bias), " aux ", dtype_name(p.aux), "|fast",
                int(p.accumulation), "|amax", p.amax_d ? 1 : 0, "|align", align[0], " ", align[1],
                " ", align[2], " ", align[3], " bias", align[4], " aux", align[5],
                p.cm.batch > 1 ? concat("|batch", p.cm.batch) : std::string(),
                p.device_alpha_beta ? "|alpha device" : "");
}

}  // namespace qmesh::detail
