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

std::string gemm_algo_key(const CanonicalGemm& c, std::string_view device_name,
                          size_t library_version) {
  const std::array<uint32_t, 4> align = gemm_operand_alignments(c);
  return concat(device_name, "|cublasLt ", library_version, "|m", c.cm.m, " n", c.cm.n, " k",
                c.cm.k, "|", c.cm.trans_a ? 'T' : 'N', c.cm.trans_b ? 'T' : 'N', " lda", c.cm.lda,
                " ldb", c.cm.ldb, "|", dtype_name(c.b.dtype), "x", dtype_name(c.a.dtype), "->",
                dtype_name(c.d_dtype), "|beta", c.beta, "|epi", int(c.epilogue), " bias ",
                dtype_name(c.bias_dtype), " aux ", dtype_name(c.aux_dtype), "|fast",
                int(c.accumulation), "|amax", c.d_amax ? 1 : 0, "|align", align[0], " ", align[1],
                " ", align[2], " ", align[3], " bias", pointer_alignment(c.bias), " aux",
                pointer_alignment(c.aux));
}

}  // namespace qmesh::detail
