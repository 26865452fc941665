// The three GEMMs of a layer (qmesh/ops/gemm.h) as GemmArgs transposes and stored operand
// shapes, for tests that run each: fprop (TN), dgrad (B stored [K, N]) and wgrad (A stored
// [K, M], B stored [K, N]).
#pragma once

#include <array>
#include <cstdint>

#include "qmesh/ops/gemm.h"

namespace qmesh::test {

struct GemmLayerForm {
  const char* name;
  GemmTranspose ta, tb;
  int64_t a_rows, a_cols, b_rows, b_cols;  // A and B as stored
};

inline std::array<GemmLayerForm, 3> gemm_layer_forms(int64_t m, int64_t n, int64_t k) {
  using enum GemmTranspose;
  return {{{"fprop", kNo, kYes, m, k, n, k},
           {"dgrad", kNo, kNo, m, k, k, n},
           {"wgrad", kYes, kNo, k, m, k, n}}};
}

// GemmArgs of form f over the operands a and b, writing d.
inline GemmArgs layer_gemm_args(const GemmLayerForm& f, const GemmOperand& a, const GemmOperand& b,
                                const TensorView& d) {
  GemmArgs args;
  args.a = a;
  args.b = b;
  args.trans_a = f.ta;
  args.trans_b = f.tb;
  args.d = d;
  return args;
}

}  // namespace qmesh::test
