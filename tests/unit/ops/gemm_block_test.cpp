// The block-scaled FP8 GEMM on the host against a float64 reference computed here from the
// codes and scales, in the three layer forms (fprop 1x128 x 128x128, dgrad through W's
// columnwise copy, wgrad 1x128 x 1x128 through both columnwise copies), with partial blocks,
// D fp32 and bf16; and the errors for what cannot run (mixed operand kinds, a missing
// columnwise copy, and cuBLASLt's rules, checked on cuda:0 views that are never read).
#include <gtest/gtest.h>

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "block_gemm_test_util.h"
#include "expect_error.h"
#include "qmesh/device.h"

namespace qmesh::test {
namespace {

constexpr DType kE4 = DType::kFloat8E4M3, kE5 = DType::kFloat8E5M2, kF32 = DType::kFloat32,
                kBf16 = DType::kBFloat16;
constexpr BlockShape k1D = BlockShape::k1x128, k2D = BlockShape::k128x128;

// One layer GEMM over tokens T, input features IN, output features OUT.
struct Form {
  const char* name;
  BlockShape a_block, b_block;
  DType a_dtype, b_dtype;
  GemmTranspose ta, tb;
  // Stored shapes of A and B, and M, N, K, from (T, IN, OUT).
  int64_t a_rows, a_cols, b_rows, b_cols, m, n, k;
};

std::vector<Form> layer_forms(int64_t t, int64_t in, int64_t out) {
  using enum GemmTranspose;
  return {
      // y [T, OUT] = x [T, IN] · W [OUT, IN]ᵀ
      {"fprop", k1D, k2D, kE4, kE4, kNo, kYes, t, in, out, in, t, out, in},
      // dx [T, IN] = dy [T, OUT] · W [OUT, IN]: W read through its columnwise copy
      {"dgrad", k1D, k2D, kE5, kE4, kNo, kNo, t, out, out, in, t, in, out},
      // dW [OUT, IN] = dyᵀ [OUT, T] · x [T, IN]: both through their columnwise copies
      {"wgrad", k1D, k1D, kE5, kE4, kYes, kNo, t, out, t, in, out, in, t},
  };
}

// Relative-norm tolerance of the host GEMM against float64. Each dequantized element is
// code · scale_inv rounded once to fp32 (exact for power-of-two scales), sgemm accumulates in
// fp32, and D is stored in its dtype: the unit roundoff of D's dtype bounds the last rounding
// (2^-8 for bf16), and 1e-5 covers the fp32 dequantization and accumulation over K <= 512
// (for random signs the accumulated error grows like sqrt(K) · 2^-24 relative to ‖D‖).
double tolerance(DType d) { return output_tolerance(d); }

std::vector<double> host_values(const Tensor& d) {
  std::vector<double> v(size_t(d.numel()));
  for (int64_t i = 0; i < d.numel(); ++i)
    v[size_t(i)] = decode(
        d.dtype(), static_cast<const uint8_t*>(d.data()) + size_t(i) * dtype_size(d.dtype()));
  return v;
}

struct FormCase {
  Form form;
  DType d;
  bool pow2_scales;
};

void run_form(const FormCase& c, uint32_t seed) {
  const Form& f = c.form;
  SCOPED_TRACE(std::string(f.name) + " M=" + std::to_string(f.m) + " N=" + std::to_string(f.n) +
               " K=" + std::to_string(f.k) + " D " + std::string(dtype_name(c.d)) +
               (c.pow2_scales ? " pow2 scales" : " arbitrary scales"));
  const BlockOperand a(f.a_dtype, f.a_block, f.a_rows, f.a_cols, seed, c.pow2_scales);
  const BlockOperand b(f.b_dtype, f.b_block, f.b_rows, f.b_cols, seed + 1, c.pow2_scales);
  Tensor d(c.d, Shape{f.m, f.n}, Device::host());
  GemmArgs g = block_args(a.tensor, b.tensor, d.view(), f.ta, f.tb);
  g.alpha = 0.75f;
  gemm(g);
  const std::vector<double> ref =
      block_reference(op_a_values(a, f.ta), op_bt_values(b, f.tb), f.m, f.n, f.k, 0.75);
  EXPECT_LT(relative_error(host_values(d), ref), tolerance(c.d));
}

TEST(BlockGemm, LayerFormsMatchFloat64) {
  uint32_t seed = 10;
  // Whole blocks, then partial ones in every dimension (T, IN, OUT not multiples of 128).
  for (const auto& [t, in, out] :
       {std::array<int64_t, 3>{256, 384, 128}, std::array<int64_t, 3>{200, 300, 136}})
    for (const Form& f : layer_forms(t, in, out))
      for (DType d : {kF32, kBf16})
        for (bool pow2 : {true, false}) run_form({f, d, pow2}, seed += 2);
}

// The scale blocks are where the reference says: with every scale but one set to 1, only
// that block's elements change D. A GEMM that used the rowwise copy of a wgrad operand, or
// a transposed scale layout, would not match.
TEST(BlockGemm, OneBlockScaleMovesOnlyItsBlock) {
  for (const Form& f : layer_forms(130, 260, 140)) {
    SCOPED_TRACE(f.name);
    BlockOperand a(f.a_dtype, f.a_block, f.a_rows, f.a_cols, 3, true);
    const BlockOperand b(f.b_dtype, f.b_block, f.b_rows, f.b_cols, 4, true);
    // Every scale of A's copy that the GEMM reads set to 1, the last block's to 2^6.
    const bool rowwise = f.ta == GemmTranspose::kNo;
    BlockCopy& copy = rowwise ? a.rowwise : a.columnwise;
    for (int64_t r = 0; r < copy.rows; ++r)
      for (int64_t c = 0; c < copy.cols; ++c) copy.scales[copy.scale_index(r, c)] = 1.0f;
    copy.scales[copy.scale_index(copy.rows - 1, copy.cols - 1)] = 64.0f;
    if (rowwise)
      BlockOperand::store(copy, a.tensor.data(), a.tensor.scale_inv());
    else
      BlockOperand::store(copy, a.tensor.data_t(), a.tensor.scale_inv_t());
    Tensor d(kF32, Shape{f.m, f.n}, Device::host());
    gemm(block_args(a.tensor, b.tensor, d.view(), f.ta, f.tb));
    const std::vector<double> ref =
        block_reference(op_a_values(a, f.ta), op_bt_values(b, f.tb), f.m, f.n, f.k, 1.0);
    EXPECT_LT(relative_error(host_values(d), ref), tolerance(kF32));
  }
}

// The epilogue and output mode apply to the block-scaled product as to any other.
TEST(BlockGemm, BiasAndAccumulate) {
  const Form f = layer_forms(64, 256, 48)[0];
  const BlockOperand a(f.a_dtype, f.a_block, f.a_rows, f.a_cols, 21, true);
  const BlockOperand b(f.b_dtype, f.b_block, f.b_rows, f.b_cols, 22, true);
  Tensor d(kF32, Shape{f.m, f.n}, Device::host());
  Tensor bias(kF32, Shape{f.n}, Device::host());
  std::vector<double> bias_v(size_t(f.n)), d_old(size_t(f.m * f.n));
  for (int64_t j = 0; j < f.n; ++j) bias.data_as<float>()[j] = float(bias_v[size_t(j)] = j - 20);
  for (int64_t i = 0; i < f.m * f.n; ++i) d.data_as<float>()[i] = float(d_old[size_t(i)] = i % 7);
  GemmArgs g = block_args(a.tensor, b.tensor, d.view());
  g.epilogue = GemmEpilogue::kBias;
  g.bias = bias.view();
  g.output = GemmOutputMode::kAccumulate;
  gemm(g);
  std::vector<double> ref =
      block_reference(op_a_values(a, f.ta), op_bt_values(b, f.tb), f.m, f.n, f.k, 1.0);
  for (int64_t i = 0; i < f.m; ++i)
    for (int64_t j = 0; j < f.n; ++j)
      ref[size_t(i * f.n + j)] += d_old[size_t(i * f.n + j)] + bias_v[size_t(j)];
  EXPECT_LT(relative_error(host_values(d), ref), tolerance(kF32));
}

// ---- errors --------------------------------------------------------------------------------

TEST(BlockGemmErrors, BlockScaledPairsOnlyWithBlockScaled) {
  const BlockOperand x(kE4, k1D, 32, 128, 1);
  Matrix w_tensor = random_matrix(kE4, 16, 128, 2);
  Matrix w_plain = random_matrix(kBf16, 16, 128, 3);
  Tensor d(kF32, Shape{32, 16}, Device::host()), d_t(kF32, Shape{16, 32}, Device::host());
  for (GemmOperand other : {w_tensor.operand(), w_plain.operand()}) {
    GemmArgs g;
    g.a = x.operand();
    g.b = other;
    g.d = d.view();
    expect_refused(g, "block-scaled FP8 operands pair only with block-scaled FP8 operands");
    std::swap(g.a, g.b);
    g.d = d_t.view();
    expect_refused(g, "block-scaled FP8 operands pair only with block-scaled FP8 operands");
  }
}

TEST(BlockGemmErrors, MissingColumnwiseCopyOnTheHostToo) {
  const Form f = layer_forms(32, 128, 16)[1];  // dgrad: W through its columnwise copy
  const BlockOperand dy(f.a_dtype, f.a_block, f.a_rows, f.a_cols, 1);
  const BlockOperand w(f.b_dtype, f.b_block, f.b_rows, f.b_cols, 2, false, false);
  Tensor d(kF32, Shape{f.m, f.n}, Device::host());
  expect_refused(block_args(dy.tensor, w.tensor, d.view(), f.ta, f.tb),
                 "b has none: quantize it with a columnwise copy");
}

TEST(BlockGemmErrors, BadScaleShape) {
  const BlockOperand x(kE4, k1D, 32, 256, 1);
  const BlockOperand w(kE4, k2D, 16, 256, 2);
  Tensor d(kF32, Shape{32, 16}, Device::host());
  GemmArgs g = block_args(x.tensor, w.tensor, d.view());
  EXPECT_TRUE(Gemm::can_implement(g).ok()) << Gemm::can_implement(g).reason();
  // 1x128 blocks of [32, 256] need scales [2, 32]; [1, 32] covers only the first 128 columns.
  g.a.block.scale_inv.shape = Shape{1, 32};
  expect_refused(g, "a scale_inv");
  // Read as 128x128 tiles, the same scale tensor has the wrong shape too ([1, 4] needed).
  g.a.block.scale_inv.shape = Shape{2, 32};
  g.a.block.block = k2D;
  expect_refused(g, "a scale_inv");
}

// cuBLASLt's rules, on views that name cuda:0 and are never read: operands [rows, cols] on
// cuda:0 with aligned fake addresses.
struct CudaViews {
  alignas(256) static inline uint8_t memory[1 << 16];
  static BlockQuantizedTensorView view(DType t, BlockShape block, int64_t rows, int64_t cols,
                                       size_t offset) {
    BlockQuantizedTensorView v;
    v.block = block;
    v.data = TensorView(memory + offset, t, Shape{rows, cols}, Device::cuda(0));
    v.scale_inv = TensorView(memory + offset + 8192, kF32, block_scale_shape(rows, cols, block),
                             Device::cuda(0));
    v.data_t = TensorView(memory + offset + 16384, t, Shape{cols, rows}, Device::cuda(0));
    v.scale_inv_t = TensorView(memory + offset + 24576, kF32, block_scale_shape(cols, rows, block),
                               Device::cuda(0));
    return v;
  }
};

GemmArgs cuda_args(BlockShape a_block, BlockShape b_block, int64_t m, int64_t n, int64_t k) {
  GemmArgs g;
  g.a = GemmOperand::fp8_block(CudaViews::view(kE4, a_block, m, k, 0));
  g.b = GemmOperand::fp8_block(CudaViews::view(kE4, b_block, n, k, 32768));
  g.d = TensorView(CudaViews::memory + 49152, kBf16, Shape{m, n}, Device::cuda(0));
  return g;
}

TEST(BlockGemmErrors, CublasLtRulesCheckedBeforeTheDevice) {
  expect_refused(cuda_args(k2D, k2D, 32, 32, 128), "two operands with 128x128 blocks");
  expect_refused(cuda_args(k1D, k2D, 36, 32, 128), "M to be a multiple of 8");
  expect_refused(cuda_args(k1D, k2D, 32, 32, 120), "K (leading dimension");
  GemmArgs misaligned = cuda_args(k1D, k2D, 32, 32, 128);
  misaligned.a.block.scale_inv.data = static_cast<uint8_t*>(misaligned.a.block.scale_inv.data) + 4;
  expect_refused(misaligned, "a's block scales (scale_inv) must be 16-byte aligned");
  // 2D x 2D and any M are fine on the host: the rules are cuBLASLt's.
  const BlockOperand x(kE4, k2D, 36, 128, 1);
  const BlockOperand w(kE4, k2D, 32, 128, 2);
  Tensor d(kF32, Shape{36, 32}, Device::host());
  const Status s = Gemm::can_implement(block_args(x.tensor, w.tensor, d.view()));
  EXPECT_TRUE(s.ok()) << s.reason();
}

}  // namespace
}  // namespace qmesh::test
