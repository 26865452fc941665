// Host backend of norm_forward (ops/norm_forward.h): LayerNorm and RMSNorm statistics and
// outputs against float64, and the fused cast against the unfused path (the norm's y, then
// quantize / cast_transpose / quantize_current_scaling of it) bit for bit: codes, columnwise
// codes, amax and scale_inv. Odd widths (not multiples of the 256 lanes), bf16 input and
// output, zero-centred gamma, NaN/Inf rows and bad arguments (an empty input among them).
#include "qmesh/ops/norm_forward.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "expect_error.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/layer_norm.h"
#include "qmesh/ops/quantize.h"
#include "qmesh/scaling/current_scaling.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

using test::random_wide;
using test::same_bits;
using test::wide_at;

struct Case {
  NormType type;
  DType x_dtype;
  DType y_dtype;
  bool zero_centered;
};

// Inputs of one norm: x [rows, cols] of `dtype`, gamma and beta fp32 [cols].
struct Inputs {
  Tensor x, gamma, beta;
  Inputs(DType dtype, int64_t rows, int64_t cols, uint32_t seed)
      : x(random_wide(dtype, Shape{rows, cols}, seed)),
        gamma(random_wide(DType::kFloat32, Shape{cols}, seed + 1)),
        beta(random_wide(DType::kFloat32, Shape{cols}, seed + 2)) {}
  TensorView beta_for(NormType t) const {
    return t == NormType::kLayerNorm ? beta.view() : TensorView{};
  }
};

// The norm's y (of y_dtype), mean (LayerNorm) and rstd.
struct Normed {
  Tensor y, mean, rstd;
};

Normed normalize_only(const Inputs& in, const Case& c, float eps) {
  const int64_t rows = in.x.shape().rows(), cols = in.x.shape().cols();
  Normed n{Tensor(c.y_dtype, Shape{rows, cols}), Tensor(DType::kFloat32, Shape{rows}),
           Tensor(DType::kFloat32, Shape{rows})};
  NormOutputs out;
  out.y_dtype = c.y_dtype;
  out.y = n.y;
  if (c.type == NormType::kLayerNorm) out.mean = n.mean;
  out.rstd = n.rstd;
  norm_forward(in.x, in.gamma, in.beta_for(c.type), {c.type, eps, c.zero_centered}, out);
  return n;
}

void expect_same_bits(const TensorView& a, const TensorView& b, const char* what) {
  ASSERT_EQ(a.nbytes(), b.nbytes()) << what;
  EXPECT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0) << what << " differ";
}

const Case kCases[] = {
    {NormType::kLayerNorm, DType::kFloat32, DType::kFloat32, false},
    {NormType::kLayerNorm, DType::kBFloat16, DType::kBFloat16, false},
    {NormType::kLayerNorm, DType::kFloat32, DType::kBFloat16, true},
    {NormType::kRmsNorm, DType::kFloat32, DType::kFloat32, false},
    {NormType::kRmsNorm, DType::kBFloat16, DType::kFloat32, true},
};

TEST(NormForward, StatisticsAndOutputMatchFloat64) {
  const float eps = 1e-5f;
  for (const Case& c : kCases) {
    for (const int64_t cols : {1, 37, 256, 300, 1031}) {
      const int64_t rows = 5;
      const Inputs in(c.x_dtype, rows, cols, 7);
      const Normed n = normalize_only(in, c, eps);
      const bool rms = c.type == NormType::kRmsNorm;
      for (int64_t r = 0; r < rows; ++r) {
        double m = 0, sq = 0;
        for (int64_t k = 0; k < cols; ++k) m += wide_at(in.x, r * cols + k);
        m = rms ? 0.0 : m / double(cols);
        for (int64_t k = 0; k < cols; ++k) {
          const double d = wide_at(in.x, r * cols + k) - m;
          sq += d * d;
        }
        const double rs = 1.0 / std::sqrt(sq / double(cols) + eps);
        if (!rms) {
          EXPECT_NEAR(n.mean.data_as<float>()[r], m, 1e-6 * (1 + std::fabs(m)));
        }
        EXPECT_NEAR(n.rstd.data_as<float>()[r], rs, 2e-6 * rs) << "cols " << cols;
        for (int64_t k = 0; k < cols; ++k) {
          const double g = in.gamma.data_as<float>()[k] + (c.zero_centered ? 1.0 : 0.0);
          const double b = rms ? 0.0 : in.beta.data_as<float>()[k];
          const double want = (wide_at(in.x, r * cols + k) - m) * rs * g + b;
          const double tol = c.y_dtype == DType::kBFloat16 ? 1e-2 : 1e-5;
          EXPECT_NEAR(wide_at(n.y, r * cols + k), want, tol * (1 + std::fabs(want)))
              << "row " << r << " col " << k << " cols " << cols;
        }
      }
    }
  }
}

// norm_forward with codes (rowwise and columnwise) against y, then cast_transpose of y.
TEST(NormForward, FusedCastEqualsNormThenCastBitForBit) {
  const float eps = 1e-6f;
  for (const Case& c : kCases) {
    for (const DType fp8 : {DType::kFloat8E4M3, DType::kFloat8E5M2}) {
      for (const int64_t cols : {1, 33, 257, 700}) {
        const int64_t rows = 9;
        const Inputs in(c.x_dtype, rows, cols, 11);
        const Normed n = normalize_only(in, c, eps);
        QuantizedTensor want(fp8, Shape{rows, cols}, Device::host(), true);
        QuantizedTensor got(fp8, Shape{rows, cols}, Device::host(), true);
        for (auto* q : {&want, &got}) {
          q->view().scale[0] = 3.5f;
          q->view().amax[0] = 0.25f;  // a running max: kept where larger
        }
        cast_transpose(n.y, want.view());
        Tensor mean(DType::kFloat32, Shape{rows}), rstd(DType::kFloat32, Shape{rows});
        NormOutputs out;
        out.y_dtype = c.y_dtype;
        out.codes = got.view();
        if (c.type == NormType::kLayerNorm) out.mean = mean;
        out.rstd = rstd;
        norm_forward(in.x, in.gamma, in.beta_for(c.type), {c.type, eps, c.zero_centered}, out);
        expect_same_bits(got.data(), want.data(), "rowwise codes");
        expect_same_bits(got.data_t(), want.data_t(), "columnwise codes");
        expect_same_bits(got.scalars(), want.scalars(), "scale, scale_inv, amax");
        expect_same_bits(rstd, n.rstd, "rstd");
        if (c.type == NormType::kLayerNorm) expect_same_bits(mean, n.mean, "mean");
      }
    }
  }
}

// Current scaling: the amax pass, set_current_scale, then the cast pass, against
// quantize_current_scaling of y.
TEST(NormForward, CurrentScalingTwoPassesEqualNormThenCurrentScalingCast) {
  Float8CurrentScaling recipe;
  for (const Case& c : kCases) {
    const int64_t rows = 6, cols = 515;
    const Inputs in(c.x_dtype, rows, cols, 21);
    const Normed n = normalize_only(in, c, 1e-5f);
    QuantizedTensor want(DType::kFloat8E4M3, Shape{rows, cols}, Device::host(), false);
    QuantizedTensor got(DType::kFloat8E4M3, Shape{rows, cols}, Device::host(), false);
    quantize_current_scaling(n.y, want.view(), recipe);
    const NormSpec spec{c.type, 1e-5f, c.zero_centered};
    NormOutputs pass1;
    pass1.y_dtype = c.y_dtype;
    pass1.amax = TensorView(got.view().amax, DType::kFloat32, Shape{1}, Device::host());
    got.view().amax[0] = 123.0f;  // replaced, not a running max
    norm_forward(in.x, in.gamma, in.beta_for(c.type), spec, pass1);
    set_current_scale(got.view(), recipe);
    NormOutputs pass2;
    pass2.y_dtype = c.y_dtype;
    pass2.codes = got.view();
    norm_forward(in.x, in.gamma, in.beta_for(c.type), spec, pass2);
    expect_same_bits(got.data(), want.data(), "codes");
    expect_same_bits(got.scalars(), want.scalars(), "scale, scale_inv, amax");
  }
}

TEST(NormForward, LayerNormForwardIsTheFp32NormWithoutCodes) {
  const Inputs in(DType::kFloat32, 4, 300, 31);
  const Case c{NormType::kLayerNorm, DType::kFloat32, DType::kFloat32, false};
  const Normed n = normalize_only(in, c, 1e-5f);
  Tensor y(DType::kFloat32, Shape{4, 300}), mean(DType::kFloat32, Shape{4}),
      rstd(DType::kFloat32, Shape{4});
  layer_norm_forward(in.x, in.gamma, in.beta, 1e-5f, y, mean, rstd);
  expect_same_bits(y, n.y, "y");
  expect_same_bits(mean, n.mean, "mean");
  expect_same_bits(rstd, n.rstd, "rstd");
}

// A NaN or an Inf in a row makes that row's outputs NaN (the canonical NaN, whatever the
// input's payload): its codes are the FP8 NaN and the amax is NaN; other rows are unaffected.
TEST(NormForward, NanAndInfRowsGiveNanRowsAndANanAmax) {
  for (const float bad :
       {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    Inputs in(DType::kFloat32, 3, 40, 41);
    in.x.data_as<float>()[40 + 7] = bad;  // row 1
    QuantizedTensor q(DType::kFloat8E4M3, Shape{3, 40}, Device::host(), false);
    Tensor y(DType::kFloat32, Shape{3, 40}), mean(DType::kFloat32, Shape{3}),
        rstd(DType::kFloat32, Shape{3});
    NormOutputs out;
    out.y = y;
    out.codes = q.view();
    out.mean = mean;
    out.rstd = rstd;
    norm_forward(in.x, in.gamma, in.beta, {}, out);
    const auto* codes = static_cast<const uint8_t*>(q.data().data());
    for (int64_t k = 0; k < 40; ++k) {
      uint32_t bits;
      std::memcpy(&bits, y.data_as<float>() + 40 + k, 4);
      EXPECT_EQ(bits, 0x7FFFFFFFu) << k;
      EXPECT_EQ(codes[40 + k] & 0x7F, 0x7F) << k;
      EXPECT_TRUE(std::isfinite(y.data_as<float>()[k]));
    }
    uint32_t amax, rstd_bits;
    std::memcpy(&amax, q.view().amax, 4);
    EXPECT_EQ(amax, 0x7FFFFFFFu);
    std::memcpy(&rstd_bits, rstd.data_as<float>() + 1, 4);
    EXPECT_EQ(rstd_bits, 0x7FFFFFFFu);  // x86 would keep the input's payload (or give -NaN)
  }
}

TEST(NormForward, BadArgumentsAreClearErrors) {
  const Inputs in(DType::kFloat32, 2, 4, 61);
  Tensor y(DType::kFloat32, Shape{2, 4}), rows(DType::kFloat32, Shape{2});
  NormOutputs out;
  out.y = y;
  const NormSpec rms{NormType::kRmsNorm, 1e-5f, false};
  EXPECT_QMESH_ERROR(norm_forward(in.x, in.gamma, in.beta, rms, out), "RMSNorm takes no beta");
  EXPECT_QMESH_ERROR(norm_forward(in.x, in.gamma, {}, {}, out), "beta");
  EXPECT_QMESH_ERROR(norm_forward(in.x, in.gamma, in.beta, {NormType::kLayerNorm, 0.0f}, out),
                     "eps");
  EXPECT_QMESH_ERROR(norm_forward(in.x, in.gamma, in.beta, {}, NormOutputs{}), "nothing to write");
  const Tensor half(DType::kFloat16, Shape{2, 4});
  EXPECT_QMESH_ERROR(norm_forward(half, in.gamma, in.beta, {}, out), "fp32 or bf16");
  EXPECT_QMESH_ERROR(norm_forward(TensorView{}, in.gamma, in.beta, {}, out), "empty view");
  NormOutputs wrong_y = out;
  wrong_y.y_dtype = DType::kBFloat16;
  EXPECT_QMESH_ERROR(norm_forward(in.x, in.gamma, in.beta, {}, wrong_y), "y_dtype");
  NormOutputs both;
  QuantizedTensor q(DType::kFloat8E4M3, Shape{2, 4}, Device::host(), false);
  both.codes = q.view();
  const Tensor amax(DType::kFloat32, Shape{1});
  both.amax = amax;
  EXPECT_QMESH_ERROR(norm_forward(in.x, in.gamma, in.beta, {}, both), "own amax");
  NormOutputs bad_rows = out;
  bad_rows.rstd = Tensor(DType::kFloat32, Shape{3});
  EXPECT_QMESH_ERROR(norm_forward(in.x, in.gamma, in.beta, {}, bad_rows), "rstd");
}

}  // namespace
}  // namespace qmesh
