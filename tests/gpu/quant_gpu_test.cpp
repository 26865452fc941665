// CUDA backend of the cast ops and scaling update against the host backend: FP8 codes, amax,
// scale_inv and scales must be bit-identical for the same inputs and scale. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "expect_error.h"
#include "qmesh/copy.h"
#include "qmesh/ops/activation_cast.h"
#include "qmesh/ops/amax.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/dbias_quantize.h"
#include "qmesh/ops/dequantize.h"
#include "qmesh/ops/grouped_quantize.h"
#include "qmesh/ops/quantize.h"
#include "qmesh/scaling/current_scaling.h"
#include "qmesh/scaling/scaling_states.h"
#include "quant_test_util.h"

namespace qmesh {
namespace {

const Device kGpu = Device::cuda(0);

#define SKIP_WITHOUT_GPU() \
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device"

Tensor to_device(const Tensor& host) {
  Tensor d(host.dtype(), host.shape(), kGpu);
  copy_tensor(d, host);
  return d;
}

std::vector<uint8_t> bytes_of(const TensorView& t) {
  std::vector<uint8_t> out(t.nbytes());
  copy_bytes(out.data(), Device::host(), t.data, t.device, t.nbytes());
  return out;
}

void set_scale(const QuantizedTensor& q, float scale) {
  copy_bytes(q.scalars().data(), q.device(), &scale, Device::host(), sizeof(float));
}

// Inputs with specials mixed in (NaN excluded: it would make every amax NaN).
Tensor input(DType dtype, const Shape& shape, uint32_t seed) {
  Tensor x = test::random_wide(dtype, shape, seed);
  const float specials[] = {0.0f, -0.0f, 1e30f, -1e30f, 1e-30f, 65504.0f};
  for (int64_t i = 0; i < x.numel(); i += 101)
    test::set_wide(x, i, specials[(i / 101) % std::size(specials)]);
  return x;
}

using GpuParam = std::tuple<DType, DType, int64_t, int64_t>;
class GpuCastTest : public ::testing::TestWithParam<GpuParam> {
 protected:
  DType in() const { return std::get<0>(GetParam()); }
  DType fp8() const { return std::get<1>(GetParam()); }
  Shape shape() const { return Shape{std::get<2>(GetParam()), std::get<3>(GetParam())}; }
};

TEST_P(GpuCastTest, QuantizeAndCastTransposeMatchHostBitwise) {
  SKIP_WITHOUT_GPU();
  const Tensor x = input(in(), shape(), 11);
  const Tensor dx = to_device(x);
  for (bool columnwise : {false, true}) {
    QuantizedTensor h(fp8(), shape(), Device::host(), columnwise);
    QuantizedTensor d(fp8(), shape(), kGpu, columnwise);
    set_scale(h, 0.37f);
    set_scale(d, 0.37f);
    if (columnwise) {
      cast_transpose(x, h.view());
      cast_transpose(dx, d.view());
      EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t()));
    } else {
      quantize(x, h.view());
      quantize(dx, d.view());
    }
    EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data()));
    EXPECT_EQ(bytes_of(d.scalars()), bytes_of(h.scalars()));
  }
}

// Two micro-batches into one tensor: the CUDA amax is the same running max as the host's.
TEST_P(GpuCastTest, RunningAmaxOfTwoCastsMatchesHost) {
  SKIP_WITHOUT_GPU();
  const Tensor first = test::random_wide(in(), shape(), 14);
  const Tensor second = input(in(), shape(), 15);
  const Tensor d_first = to_device(first), d_second = to_device(second);
  QuantizedTensor h(fp8(), shape(), Device::host(), true);
  QuantizedTensor d(fp8(), shape(), kGpu, true);
  set_scale(h, 0.5f);
  set_scale(d, 0.5f);
  quantize(first, h.view());
  cast_transpose(second, h.view());
  quantize(d_first, d.view());
  cast_transpose(d_second, d.view());
  EXPECT_EQ(bytes_of(d.scalars()), bytes_of(h.scalars()));
}

TEST_P(GpuCastTest, DbiasQuantizeMatchesHost) {
  SKIP_WITHOUT_GPU();
  // No specials: fp16 turns +-1e30 into +-inf, whose column sums are not comparable.
  const Tensor g = test::random_wide(in(), shape(), 12);
  const Tensor dg = to_device(g);
  QuantizedTensor h(fp8(), shape(), Device::host(), true);
  QuantizedTensor d(fp8(), shape(), kGpu, true);
  set_scale(h, 3.0f);
  set_scale(d, 3.0f);
  const int64_t cols = shape().cols();
  Tensor hb(DType::kFloat32, Shape{cols}), db(DType::kFloat32, Shape{cols}, kGpu);
  dbias_quantize(g, h.view(), hb);
  dbias_quantize(dg, d.view(), db);
  EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data()));
  EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t()));
  EXPECT_EQ(bytes_of(d.scalars()), bytes_of(h.scalars()));
  std::vector<float> got(cols);
  copy_bytes(got.data(), Device::host(), db.data(), kGpu, cols * sizeof(float));
  for (int64_t c = 0; c < cols; ++c) {
    double sum_abs = 0;
    for (int64_t r = 0; r < shape().rows(); ++r)
      sum_abs += std::fabs(test::wide_at(g, r * cols + c));
    EXPECT_NEAR(got[c], hb.data_as<float>()[c],
                2.0 * shape().rows() * std::ldexp(1.0, -24) * sum_abs)
        << "column " << c;
  }
}

// The GELU-fused casts: codes, columnwise codes, amax and scale_inv bit for bit (one fp32
// GELU on both, ops/activation_cast.h); the bias gradient to fp32 summation order.
TEST_P(GpuCastTest, GeluCastTransposeMatchesHost) {
  SKIP_WITHOUT_GPU();
  const Tensor pre = input(in(), shape(), 16);
  const Tensor dpre = to_device(pre);
  for (bool columnwise : {true, false}) {
    QuantizedTensor h(fp8(), shape(), Device::host(), columnwise);
    QuantizedTensor d(fp8(), shape(), kGpu, columnwise);
    set_scale(h, 0.75f);
    set_scale(d, 0.75f);
    gelu_cast_transpose(pre, h.view());
    gelu_cast_transpose(dpre, d.view());
    EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data())) << "columnwise " << columnwise;
    if (columnwise) {
      EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t()));
    }
    EXPECT_EQ(bytes_of(d.scalars()), bytes_of(h.scalars())) << "columnwise " << columnwise;
  }
  Tensor ha(DType::kFloat32, Shape{1}), da(DType::kFloat32, Shape{1}, kGpu);
  gelu_amax(pre, ha);
  gelu_amax(dpre, da);
  EXPECT_EQ(bytes_of(da), bytes_of(ha));
}

TEST_P(GpuCastTest, DgeluDbiasCastTransposeMatchesHost) {
  SKIP_WITHOUT_GPU();
  // No specials in dh: +-inf gradients make column sums that are not comparable.
  const Tensor dh = test::random_wide(in(), shape(), 17);
  const Tensor pre = input(in(), shape(), 18);
  const Tensor ddh = to_device(dh), dpre = to_device(pre);
  const int64_t cols = shape().cols();
  for (bool columnwise : {true, false}) {
    QuantizedTensor h(fp8(), shape(), Device::host(), columnwise);
    QuantizedTensor d(fp8(), shape(), kGpu, columnwise);
    set_scale(h, 2.0f);
    set_scale(d, 2.0f);
    Tensor hb(DType::kFloat32, Shape{cols}), db(DType::kFloat32, Shape{cols}, kGpu);
    dgelu_dbias_cast_transpose(dh, pre, h.view(), hb);
    dgelu_dbias_cast_transpose(ddh, dpre, d.view(), db);
    EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data())) << "columnwise " << columnwise;
    if (columnwise) {
      EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t()));
    }
    EXPECT_EQ(bytes_of(d.scalars()), bytes_of(h.scalars())) << "columnwise " << columnwise;
    std::vector<float> got(cols);
    copy_bytes(got.data(), Device::host(), db.data(), kGpu, cols * sizeof(float));
    // The fp32 summation-order bound of docs/numerics.md, over the summed values |g| <= |dh| ·
    // max|gelu'| (< 1.2).
    for (int64_t c = 0; c < cols; ++c) {
      double sum_abs = 0;
      for (int64_t r = 0; r < shape().rows(); ++r)
        sum_abs += 1.2 * std::fabs(test::wide_at(dh, r * cols + c));
      const float want = hb.data_as<float>()[c];
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(got[c])) << "column " << c;
        continue;
      }
      EXPECT_NEAR(got[c], want, 2.0 * shape().rows() * std::ldexp(1.0, -24) * sum_abs)
          << "column " << c;
    }
  }
  Tensor ha(DType::kFloat32, Shape{1}), da(DType::kFloat32, Shape{1}, kGpu);
  dgelu_amax(dh, pre, ha);
  dgelu_amax(ddh, dpre, da);
  EXPECT_EQ(bytes_of(da), bytes_of(ha));
}

TEST_P(GpuCastTest, AmaxAndDequantizeMatchHost) {
  SKIP_WITHOUT_GPU();
  const Tensor x = input(in(), shape(), 13);
  const Tensor dx = to_device(x);
  Tensor ha(DType::kFloat32, Shape{1}), da(DType::kFloat32, Shape{1}, kGpu);
  amax(x, ha);
  amax(dx, da);
  EXPECT_EQ(bytes_of(da), bytes_of(ha));
  QuantizedTensor h(fp8(), shape(), Device::host(), false);
  quantize(x, h.view());
  QuantizedTensor d(fp8(), shape(), kGpu, false);
  copy_tensor(d.data(), h.data());
  copy_tensor(d.scalars(), h.scalars());
  Tensor hout(in(), shape()), dout(in(), shape(), kGpu);
  dequantize(h.view(), hout);
  dequantize(d.view(), dout);
  EXPECT_EQ(bytes_of(dout), bytes_of(hout));
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, GpuCastTest,
    ::testing::Combine(::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16),
                       ::testing::Values(DType::kFloat8E4M3, DType::kFloat8E5M2),
                       ::testing::Values(1, 17, 64, 1000, 2048),
                       ::testing::Values(1, 48, 100, 4096)),
    [](const ::testing::TestParamInfo<GpuParam>& p) {
      return std::string(dtype_name(std::get<0>(p.param))) + "_" +
             std::string(dtype_name(std::get<1>(p.param))) + "_" +
             std::to_string(std::get<2>(p.param)) + "x" + std::to_string(std::get<3>(p.param));
    });

TEST(GpuGroupedQuantize, MatchesHostBitwise) {
  SKIP_WITHOUT_GPU();
  // 70 groups (more than one launch's worth), odd sizes so that some groups are unaligned;
  // every third group also gets its columnwise copy (a tiled launch of its own).
  std::vector<Shape> shapes;
  int64_t total = 0;
  for (int g = 0; g < 70; ++g) {
    shapes.push_back(Shape{1 + g % 5, 1 + (g * 37) % 300});
    total += shapes.back().numel();
  }
  const Tensor x = input(DType::kBFloat16, Shape{total}, 14);
  const Tensor dx = to_device(x);
  std::vector<QuantizedTensor> h, d;
  std::vector<QuantizedTensorView> hv, dv;
  for (size_t g = 0; g < shapes.size(); ++g) {
    const bool columnwise = g % 3 == 0;
    h.emplace_back(DType::kFloat8E4M3, shapes[g], Device::host(), columnwise);
    d.emplace_back(DType::kFloat8E4M3, shapes[g], kGpu, columnwise);
    set_scale(h.back(), 0.5f + float(g));
    set_scale(d.back(), 0.5f + float(g));
  }
  for (size_t g = 0; g < shapes.size(); ++g) {
    hv.push_back(h[g].view());
    dv.push_back(d[g].view());
  }
  grouped_quantize(x, hv);
  grouped_quantize(dx, dv);
  for (size_t g = 0; g < shapes.size(); ++g) {
    EXPECT_EQ(bytes_of(d[g].data()), bytes_of(h[g].data())) << "group " << g;
    if (h[g].has_columnwise()) {
      EXPECT_EQ(bytes_of(d[g].data_t()), bytes_of(h[g].data_t())) << "group " << g << " columnwise";
    }
    EXPECT_EQ(bytes_of(d[g].scalars()), bytes_of(h[g].scalars())) << "group " << g;
  }
}

// NaN and infinite pre-activations: NaN codes and the canonical NaN amax on both backends.
TEST(GpuActivationCast, NanAndInfinitiesMatchHost) {
  SKIP_WITHOUT_GPU();
  Tensor pre = test::random_wide(DType::kFloat32, Shape{33, 40}, 19);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f};
  for (int64_t i = 0; i < pre.numel(); i += 37)
    test::set_wide(pre, i, specials[(i / 37) % std::size(specials)]);
  const Tensor ones = test::random_wide(DType::kFloat32, Shape{33, 40}, 20);
  const Tensor dpre = to_device(pre), dones = to_device(ones);
  QuantizedTensor h(DType::kFloat8E4M3, Shape{33, 40}, Device::host(), true);
  QuantizedTensor d(DType::kFloat8E4M3, Shape{33, 40}, kGpu, true);
  gelu_cast_transpose(pre, h.view());
  gelu_cast_transpose(dpre, d.view());
  EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data()));
  EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t()));
  EXPECT_EQ(bytes_of(d.scalars()), bytes_of(h.scalars()));
  QuantizedTensor hg(DType::kFloat8E5M2, Shape{33, 40}, Device::host(), true);
  QuantizedTensor dg(DType::kFloat8E5M2, Shape{33, 40}, kGpu, true);
  Tensor hb(DType::kFloat32, Shape{40}), db(DType::kFloat32, Shape{40}, kGpu);
  dgelu_dbias_cast_transpose(ones, pre, hg.view(), hb);
  dgelu_dbias_cast_transpose(dones, dpre, dg.view(), db);
  EXPECT_EQ(bytes_of(dg.data()), bytes_of(hg.data()));
  EXPECT_EQ(bytes_of(dg.data_t()), bytes_of(hg.data_t()));
  EXPECT_EQ(bytes_of(dg.scalars()), bytes_of(hg.scalars()));
}

// Enough tiles that every block of the tiled kernel casts several (its shared buffers
// alternate between tiles), with the rowwise and columnwise codes, the amax and the column
// sums: a 16-byte-aligned shape with a partial column of tiles, and one with element accesses
// and partial tiles on both sides.
TEST(GpuTiledCast, ManyTilesPerBlockMatchHost) {
  SKIP_WITHOUT_GPU();
  for (const Shape& shape : {Shape{4096, 4112}, Shape{4200, 4136}}) {
    const Tensor g = test::random_wide(DType::kBFloat16, shape, 21);
    const Tensor dg = to_device(g);
    QuantizedTensor h(DType::kFloat8E4M3, shape, Device::host(), true);
    QuantizedTensor d(DType::kFloat8E4M3, shape, kGpu, true);
    set_scale(h, 1.5f);
    set_scale(d, 1.5f);
    const int64_t cols = shape.cols();
    Tensor hb(DType::kFloat32, Shape{cols}), db(DType::kFloat32, Shape{cols}, kGpu);
    dbias_quantize(g, h.view(), hb);
    dbias_quantize(dg, d.view(), db);
    EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data())) << shape.str();
    EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t())) << shape.str();
    EXPECT_EQ(bytes_of(d.scalars()), bytes_of(h.scalars())) << shape.str();
    std::vector<float> got(cols);
    copy_bytes(got.data(), Device::host(), db.data(), kGpu, cols * sizeof(float));
    for (int64_t c = 0; c < cols; ++c) {
      double sum_abs = 0;
      for (int64_t r = 0; r < shape.rows(); ++r)
        sum_abs += std::fabs(test::wide_at(g, r * cols + c));
      ASSERT_NEAR(got[c], hb.data_as<float>()[c],
                  2.0 * shape.rows() * std::ldexp(1.0, -24) * sum_abs)
          << shape.str() << " column " << c;
    }
  }
}

// The CUDA amax passes evaluate the activation only where activation_bound says an element may
// raise the maximum: the same amax as the host's, bit for bit, where that skips little or
// nothing (every element a new maximum; large gradients where gelu' is small; tiny values
// only), with a NaN, -inf or a pre-activation past 2^32 (NaN from finite inputs) as the last
// element, from an unaligned start (element accesses) and over a size that is not a multiple
// of a block's step (70001 elements, several steps).
TEST(GpuAmaxPass, MatchesHostWhereSkippingIsHard) {
  SKIP_WITHOUT_GPU();
  constexpr int64_t kN = 70001;
  constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
  constexpr float kInf = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int pattern = 0; pattern < 6; ++pattern) {
      Tensor x = test::random_wide(dtype, Shape{kN + 1}, 30 + pattern);
      Tensor pre = test::random_wide(dtype, Shape{kN + 1}, 40 + pattern);
      for (int64_t i = 0; i <= kN; ++i) {
        if (pattern == 0) test::set_wide(x, i, 1e-3f * float(i));
        if (pattern == 1) {
          test::set_wide(x, i, -0.01f * float(i % 977));
          test::set_wide(pre, i, -float(i % 13));
        }
        if (pattern == 2) test::set_wide(x, i, 1e-40f * float(i % 5));  // 0 in fp16
      }
      const float last[] = {0.0f, 0.0f, 0.0f, kNan, -kInf, 1.0f};
      if (pattern >= 3) test::set_wide(x, kN, last[pattern]);
      if (pattern == 5) test::set_wide(pre, kN, 1e30f);  // inf in fp16
      const Tensor dx = to_device(x), dpre = to_device(pre);
      for (int64_t offset : {0, 1}) {
        const auto at = [&](const Tensor& t) {
          return TensorView(static_cast<char*>(t.data()) + offset * dtype_size(dtype), dtype,
                            Shape{kN}, t.device());
        };
        const std::string what = std::string(dtype_name(dtype)) + " pattern " +
                                 std::to_string(pattern) + " offset " + std::to_string(offset);
        Tensor ha(DType::kFloat32, Shape{1}), da(DType::kFloat32, Shape{1}, kGpu);
        if (pattern != 3) {  // (a plain amax of NaN keeps the NaN's payload: not checked here)
          amax(at(x), ha);
          amax(at(dx), da);
          EXPECT_EQ(bytes_of(da), bytes_of(ha)) << "amax " << what;
        }
        gelu_amax(at(x), ha);
        gelu_amax(at(dx), da);
        EXPECT_EQ(bytes_of(da), bytes_of(ha)) << "gelu_amax " << what;
        dgelu_amax(at(x), at(pre), ha);
        dgelu_amax(at(dx), at(dpre), da);
        EXPECT_EQ(bytes_of(da), bytes_of(ha)) << "dgelu_amax " << what;
      }
    }
  }
}

// Tensors on different devices are refused on the host, before anything is launched.
TEST(GpuCastErrors, MixedDevicesAreRefused) {
  SKIP_WITHOUT_GPU();
  const Shape shape{4, 32};
  const Tensor x = input(DType::kFloat32, shape, 16);
  const Tensor dx = to_device(x);
  QuantizedTensor h(DType::kFloat8E4M3, shape, Device::host(), true);
  QuantizedTensor d(DType::kFloat8E4M3, shape, kGpu, true);
  EXPECT_QMESH_ERROR(quantize(x, d.view()), "must be on host, got cuda:0");
  EXPECT_QMESH_ERROR(cast_transpose(dx, h.view()), "must be on cuda:0, got host");
  Tensor host_amax(DType::kFloat32, Shape{1});
  EXPECT_QMESH_ERROR(amax(dx, host_amax), "amax output must be on cuda:0");
  Tensor host_dbias(DType::kFloat32, Shape{shape.cols()});
  EXPECT_QMESH_ERROR(dbias_quantize(dx, d.view(), host_dbias), "dbias must be on cuda:0");
  Tensor host_out(DType::kFloat32, shape);
  EXPECT_QMESH_ERROR(dequantize(d.view(), host_out), "dequantize output must be on cuda:0");
  const QuantizedTensorView mixed[] = {d.view(), h.view()};
  EXPECT_QMESH_ERROR(grouped_quantize(to_device(input(DType::kFloat32, Shape{2 * 128}, 17)), mixed),
                     "grouped_quantize output 1");
  // A hand-built view whose scalars are host memory: refused before any launch.
  QuantizedTensorView host_scalars = d.view();
  host_scalars.scale = h.view().scale;
  EXPECT_QMESH_ERROR(quantize(dx, host_scalars),
                     "scale must point to an fp32 scalar in the memory");
  host_scalars = d.view();
  host_scalars.amax = h.view().amax;
  EXPECT_QMESH_ERROR(cast_transpose(dx, host_scalars), "amax must point to an fp32 scalar");
  host_scalars = d.view();
  host_scalars.scale_inv = h.view().scale_inv;
  EXPECT_QMESH_ERROR(dequantize(host_scalars, to_device(host_out)), "scale_inv must point");
  // Nothing above reached the device: a launch afterwards still works.
  quantize(dx, d.view());
  quantize(x, h.view());
  EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data()));
}

TEST(GpuScaling, FusedUpdateMatchesHostBitwise) {
  SKIP_WITHOUT_GPU();
  for (int len : {1, 16, 1024}) {
    for (AmaxComputeAlgo algo : {AmaxComputeAlgo::kMax, AmaxComputeAlgo::kMostRecent}) {
      DelayedScaling recipe;
      recipe.amax_history_len = len;
      recipe.amax_compute_algo = algo;
      recipe.margin = 1.0f;
      std::vector<OperandRole> roles(37, OperandRole::kInput);
      for (size_t i = 0; i < roles.size(); i += 3) roles[i] = OperandRole::kGradOutput;
      ScalingStates h(recipe, roles), d(recipe, roles, kGpu);
      std::mt19937 rng(len);
      std::uniform_real_distribution<double> log2_value(-130.0, 100.0);
      std::bernoulli_distribution skipped(0.1), nan(0.01);
      std::vector<float> amax(roles.size());
      for (int step = 0; step < len + 50; ++step) {
        for (float& a : amax)
          a = skipped(rng) ? 0.0f
                           : (nan(rng) ? NAN : static_cast<float>(std::exp2(log2_value(rng))));
        std::memcpy(h.current_amax().data, amax.data(), amax.size() * sizeof(float));
        copy_bytes(d.current_amax().data, kGpu, amax.data(), Device::host(),
                   amax.size() * sizeof(float));
        h.update();
        d.update();
      }
      EXPECT_EQ(bytes_of(d.scale()), bytes_of(h.scale())) << "len " << len;
      EXPECT_EQ(bytes_of(d.amax_history()), bytes_of(h.amax_history())) << "len " << len;
    }
  }
}

TEST(GpuScaling, CurrentScalingMatchesHostBitwise) {
  SKIP_WITHOUT_GPU();
  const Tensor x = input(DType::kFloat32, Shape{129, 257}, 15);
  const Tensor dx = to_device(x);
  Float8CurrentScaling recipe;
  recipe.power_of_two_scales = true;
  QuantizedTensor h(DType::kFloat8E5M2, Shape{129, 257}, Device::host(), true);
  QuantizedTensor d(DType::kFloat8E5M2, Shape{129, 257}, kGpu, true);
  quantize_current_scaling(x, h.view(), recipe);
  quantize_current_scaling(dx, d.view(), recipe);
  EXPECT_EQ(bytes_of(d.scalars()), bytes_of(h.scalars()));
  EXPECT_EQ(bytes_of(d.data()), bytes_of(h.data()));
  EXPECT_EQ(bytes_of(d.data_t()), bytes_of(h.data_t()));
}

}  // namespace
}  // namespace qmesh
