// Host test matrices for GEMM tests: random operands in any GEMM dtype (FP8 ones quantized
// with the bit-exact host encoder, their columnwise copy filled by a plain transpose), their
// exact dequantized values in float64, and a float64 reference GEMM written from the
// definition in qmesh/ops/gemm.h.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include "expect_error.h"
#include "qmesh/float16.h"
#include "qmesh/fp8.h"
#include "qmesh/ops/gemm.h"

namespace qmesh::test {

inline double decode(DType t, const uint8_t* p) {
  uint16_t h = 0;
  switch (t) {
    case DType::kFloat32: {
      float f = 0;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::kBFloat16:
      std::memcpy(&h, p, 2);
      return bf16_to_float(h);
    case DType::kFloat16:
      std::memcpy(&h, p, 2);
      return fp16_to_float(h);
    case DType::kFloat8E4M3:
      return e4m3_to_float(*p);
    default:
      return e5m2_to_float(*p);
  }
}

// Stores x (rounded to nearest-even) in dtype t.
inline void encode(DType t, double x, uint8_t* p) {
  const float f = float(x);
  uint16_t h = 0;
  switch (t) {
    case DType::kFloat32:
      std::memcpy(p, &f, 4);
      return;
    case DType::kBFloat16:
      h = float_to_bf16(f);
      std::memcpy(p, &h, 2);
      return;
    case DType::kFloat16:
      h = float_to_fp16(f);
      std::memcpy(p, &h, 2);
      return;
    case DType::kFloat8E4M3:
      *p = float_to_e4m3(f);
      return;
    default:
      *p = float_to_e5m2(f);
  }
}

// A host matrix [rows, cols] of any GEMM dtype. values() are what the GEMM must see:
// decoded elements, times scale_inv for FP8.
struct Matrix {
  DType dtype = DType::kFloat32;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> bytes_t;  // FP8: codes of the transpose
  float scalars[3] = {1, 1, 0};  // FP8: scale, scale_inv, amax

  Matrix() = default;
  Matrix(DType t, int64_t r, int64_t c)
      : dtype(t), rows(r), cols(c), bytes(size_t(r * c) * dtype_size(t)) {}

  size_t esize() const { return dtype_size(dtype); }
  double value(int64_t r, int64_t c) const {
    const double v = decode(dtype, bytes.data() + size_t(r * cols + c) * esize());
    return is_fp8(dtype) ? v * double(scalars[1]) : v;
  }
  void set(int64_t r, int64_t c, double x) {
    encode(dtype, x, bytes.data() + size_t(r * cols + c) * esize());
  }
  std::vector<double> values() const {
    std::vector<double> v(size_t(rows * cols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) v[size_t(r * cols + c)] = value(r, c);
    return v;
  }
  TensorView view() { return TensorView(bytes.data(), dtype, Shape{rows, cols}); }
  QuantizedTensorView qview(bool columnwise) {
    QuantizedTensorView q;
    q.data = view();
    if (columnwise) q.data_t = TensorView(bytes_t.data(), dtype, Shape{cols, rows});
    q.scale = &scalars[0];
    q.scale_inv = &scalars[1];
    q.amax = &scalars[2];
    return q;
  }
  GemmOperand operand(bool columnwise = true) {
    return is_fp8(dtype) ? GemmOperand::fp8(qview(columnwise)) : GemmOperand::plain(view());
  }
};

// Arguments of the TN GEMM D = A · Bᵀ over host matrices A [M, K], B [N, K], D [M, N].
inline GemmArgs tn_args(Matrix& a, Matrix& b, Matrix& d) {
  GemmArgs g;
  g.a = a.operand();
  g.b = b.operand();
  g.d = d.view();
  return g;
}

// Uniform values in [-spread, spread]. FP8: quantized with scale = fp8_max / amax (delayed
// scaling's rule), transpose codes filled.
inline Matrix random_matrix(DType t, int64_t rows, int64_t cols, uint32_t seed,
                            double spread = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-float(spread), float(spread));
  std::vector<float> x(size_t(rows * cols));
  for (float& v : x) v = dist(rng);
  Matrix m(t, rows, cols);
  if (!is_fp8(t)) {
    for (size_t i = 0; i < x.size(); ++i) encode(t, x[i], m.bytes.data() + i * m.esize());
    return m;
  }
  float amax = 0;
  for (float v : x) amax = std::max(amax, std::fabs(v));
  m.scalars[0] = fp8_max(t) / amax;
  m.scalars[1] = 1.0f / m.scalars[0];
  m.scalars[2] = amax;
  fp32_to_fp8(x.data(), m.bytes.data(), x.size(), t, m.scalars[0]);
  m.bytes_t.resize(m.bytes.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      m.bytes_t[size_t(c * rows + r)] = m.bytes[size_t(r * cols + c)];
  return m;
}

inline double gelu_ref(double x) {
  return 0.5 * x *
         (1.0 + std::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}
inline double dgelu_ref(double x) {
  const double u = std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * x * x * x);
  const double t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * std::sqrt(2.0 / std::numbers::pi) *
                               (1.0 + 3.0 * 0.044715 * x * x);
}

// The float64 reference. Inputs are the dequantized values; `d_old` is D before the call
// (used with kAccumulate), `aux_in` the saved pre-activation (kDGelu), `bias` [N].
struct Reference {
  std::vector<double> d;      // [M, N] before any output rounding / D scaling
  std::vector<double> aux;    // kBiasGeluAux: pre-activation [M, N]
  std::vector<double> dbias;  // kBiasGrad: [M]
};

inline Reference reference_gemm(const Matrix& a, GemmTranspose ta, const Matrix& b,
                                GemmTranspose tb, double alpha, GemmEpilogue epi,
                                GemmOutputMode mode, const std::vector<double>& d_old,
                                const std::vector<double>& bias,
                                const std::vector<double>& aux_in) {
  const bool at = ta == GemmTranspose::kYes, bt = tb == GemmTranspose::kYes;
  const int64_t m = at ? a.cols : a.rows, k = at ? a.rows : a.cols;
  const int64_t n = bt ? b.rows : b.cols;
  const std::vector<double> av = a.values(), bv = b.values();
  Reference ref;
  ref.d.assign(size_t(m * n), 0.0);
  if (epi == GemmEpilogue::kBiasGeluAux) ref.aux.assign(size_t(m * n), 0.0);
  if (epi == GemmEpilogue::kBiasGrad) ref.dbias.assign(size_t(m), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double x = at ? av[size_t(p * m + i)] : av[size_t(i * k + p)];
      if (epi == GemmEpilogue::kBiasGrad) ref.dbias[size_t(i)] += x;
      for (int64_t j = 0; j < n; ++j)
        ref.d[size_t(i * n + j)] += x * (bt ? bv[size_t(j * k + p)] : bv[size_t(p * n + j)]);
    }
    for (int64_t j = 0; j < n; ++j) {
      double& r = ref.d[size_t(i * n + j)];
      r *= alpha;
      if (mode == GemmOutputMode::kAccumulate) r += d_old[size_t(i * n + j)];
      switch (epi) {
        case GemmEpilogue::kBias:
          r += bias[size_t(j)];
          break;
        case GemmEpilogue::kGelu:
          r = gelu_ref(r);
          break;
        case GemmEpilogue::kBiasGeluAux:
          r += bias[size_t(j)];
          ref.aux[size_t(i * n + j)] = r;
          r = gelu_ref(r);
          break;
        case GemmEpilogue::kDGelu:
          r *= dgelu_ref(aux_in[size_t(i * n + j)]);
          break;
        default:
          break;
      }
    }
  }
  return ref;
}

// ‖out − ref‖ / ‖ref‖ (ref must not be all zero).
inline double relative_error(const std::vector<double>& out, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += (out[i] - ref[i]) * (out[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// Tolerance of a relative-norm check on an output stored in dtype t: round-to-nearest makes
// each element's relative error at most the unit roundoff u = 2^-(mantissa bits + 1), so the
// norm ratio is at most u; 1e-5 on top covers fp32 accumulation over K <= a few thousand.
inline double output_tolerance(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 1e-5;
    case DType::kBFloat16:
      return std::ldexp(1.0, -8) + 1e-5;
    case DType::kFloat16:
      return std::ldexp(1.0, -11) + 1e-5;
    case DType::kFloat8E4M3:
      return std::ldexp(1.0, -4) + 1e-5;
    default:
      return std::ldexp(1.0, -3) + 1e-5;
  }
}

// Expects can_implement to refuse with a reason containing `substring`, and gemm() and
// gemm_planned() to throw the same.
inline void expect_refused(const GemmArgs& args, const std::string& substring) {
  const Status s = Gemm::can_implement(args);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.reason().find(substring), std::string::npos) << "reason was: " << s.reason();
  EXPECT_QMESH_ERROR(gemm(args), substring);
  EXPECT_QMESH_ERROR(gemm_planned(args, nullptr, Stream{}), substring);
}

}  // namespace qmesh::test
