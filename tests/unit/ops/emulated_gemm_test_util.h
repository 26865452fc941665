// The check shared by the tests of the emulated microscaled GEMMs (MXFP8, NVFP4): an emulated
// GEMM gave the bits of the plain fp32 GEMM of its dequantized operands.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "qmesh/ops/gemm.h"
#include "qmesh/tensor.h"

namespace qmesh::test {

// Expects `d` (fp32 [m, n], written by the emulated GEMM `args`) to hold the bits of the plain
// fp32 GEMM (canonical TN form, args' epilogue and output) of `a32` [m, k] and `b32` [n, k]:
// the dequantized copies of the operands that run along K.
inline void expect_plain_gemm_bits(const GemmArgs& args, const Tensor& d, const Tensor& a32,
                                   const Tensor& b32) {
  GemmArgs plain = args;
  plain.a = GemmOperand::plain(a32.view());
  plain.b = GemmOperand::plain(b32.view());
  plain.trans_a = GemmTranspose::kNo;
  plain.trans_b = GemmTranspose::kYes;
  Tensor d32(DType::kFloat32, d.shape());
  plain.d = d32.view();
  gemm(plain);
  EXPECT_EQ(std::memcmp(d.data(), d32.data(), d.nbytes()), 0);
}

}  // namespace qmesh::test
