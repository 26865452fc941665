// qmesh's C++ ops called directly on host buffers, as a C ABI for the JAX tests (ctypes): the
// handlers must give bit for bit what the library gives on the same data. Each function
// returns 0, or 1 after printing qmesh's error to stderr.
#include <cstdint>
#include <cstdio>
#include <exception>

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/ops/quantize.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/tensor.h"

namespace {

template <class F>
int guarded(F&& f) {
  try {
    f();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qmesh_jax_reference: %s\n", e.what());
    return 1;
  }
}

qmesh::Shape matrix(int64_t rows, int64_t cols) { return qmesh::Shape{rows, cols}; }

}  // namespace

extern "C" {

// quantize(x [rows, cols] of dtype `in_dtype`, scale) into FP8 `fp8_dtype` codes q (and the
// columnwise copy q_t [cols, rows] when q_t is not null); writes amax and scale_inv.
// Dtypes are qmesh::DType values.
__attribute__((visibility("default"))) int qmesh_ref_quantize(void* x, int in_dtype, int64_t rows,
                                                              int64_t cols, float* scale,
                                                              int fp8_dtype, void* q, void* q_t,
                                                              float* amax, float* scale_inv) {
  return guarded([&] {
    const auto fp8 = static_cast<qmesh::DType>(fp8_dtype);
    qmesh::QuantizedTensorView out;
    out.data = qmesh::TensorView(q, fp8, matrix(rows, cols));
    if (q_t != nullptr) out.data_t = qmesh::TensorView(q_t, fp8, matrix(cols, rows));
    out.scale = scale;
    out.scale_inv = scale_inv;
    out.amax = amax;
    *amax = 0.0f;
    const qmesh::TensorView in(x, static_cast<qmesh::DType>(in_dtype), matrix(rows, cols));
    if (q_t != nullptr) {
      qmesh::cast_transpose(in, out);
    } else {
      qmesh::quantize(in, out);
    }
  });
}

// d [m, n] (float32) = a [m, k] · b [n, k]ᵀ with FP8 operands of the given dtypes and their
// scale_inv (the canonical TN form, no epilogue).
__attribute__((visibility("default"))) int qmesh_ref_gemm_fp8_tn(void* a, int a_dtype,
                                                                 float* a_scale_inv, void* b,
                                                                 int b_dtype, float* b_scale_inv,
                                                                 int64_t m, int64_t n, int64_t k,
                                                                 float* d) {
  return guarded([&] {
    float unused_scale = 1.0f, unused_amax = 0.0f;  // a GEMM reads only scale_inv
    qmesh::QuantizedTensorView qa;
    qa.scale = &unused_scale;
    qa.amax = &unused_amax;
    qa.data = qmesh::TensorView(a, static_cast<qmesh::DType>(a_dtype), matrix(m, k));
    qa.scale_inv = a_scale_inv;
    qmesh::QuantizedTensorView qb;
    qb.scale = &unused_scale;
    qb.amax = &unused_amax;
    qb.data = qmesh::TensorView(b, static_cast<qmesh::DType>(b_dtype), matrix(n, k));
    qb.scale_inv = b_scale_inv;
    qmesh::GemmArgs args;
    args.a = qmesh::GemmOperand::fp8(qa);
    args.b = qmesh::GemmOperand::fp8(qb);
    args.d = qmesh::TensorView(d, qmesh::DType::kFloat32, matrix(m, n));
    qmesh::gemm(args);
  });
}

// block_quantize(x [rows, cols] of dtype `in_dtype`) into FP8 `fp8_dtype` codes q with
// scale_inv (block_scale_shape; `block` 1 = 1x128, 2 = 128x128), and the columnwise copy
// q_t / scale_inv_t when q_t is not null. The scale buffers must come zero-filled.
__attribute__((visibility("default"))) int qmesh_ref_block_quantize(
    void* x, int in_dtype, int64_t rows, int64_t cols, int fp8_dtype, int block, bool power_2_scale,
    float amax_epsilon, void* q, float* scale_inv, void* q_t, float* scale_inv_t) {
  return guarded([&] {
    const auto fp8 = static_cast<qmesh::DType>(fp8_dtype);
    const auto shape = block == 1 ? qmesh::BlockShape::k1x128 : qmesh::BlockShape::k128x128;
    qmesh::BlockQuantizedTensorView out;
    out.block = shape;
    out.data = qmesh::TensorView(q, fp8, matrix(rows, cols));
    out.scale_inv = qmesh::TensorView(scale_inv, qmesh::DType::kFloat32,
                                      qmesh::block_scale_shape(rows, cols, shape));
    if (q_t != nullptr) {
      out.data_t = qmesh::TensorView(q_t, fp8, matrix(cols, rows));
      out.scale_inv_t = qmesh::TensorView(scale_inv_t, qmesh::DType::kFloat32,
                                          qmesh::block_scale_shape(cols, rows, shape));
    }
    const qmesh::TensorView in(x, static_cast<qmesh::DType>(in_dtype), matrix(rows, cols));
    qmesh::block_quantize(in, out, qmesh::QParams{power_2_scale, amax_epsilon});
  });
}

}  // extern "C"
