// The C API's boundary under mpirun (2 ranks): every error path returns its status and a
// message naming the problem (null handles, struct sizes, enums, tensors, shapes that do not
// divide, a peer that never comes); the thread's last error is per thread; collectives and
// the loss agree with values computed here.
#include "qmesh/c_api.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

namespace {

using ::testing::HasSubstr;

// A status and the message that must come with it.
#define EXPECT_STATUS(call, status, text)                          \
  do {                                                             \
    EXPECT_EQ((call), (status)) << qmesh_last_error();             \
    EXPECT_THAT(std::string(qmesh_last_error()), HasSubstr(text)); \
  } while (0)

class CApi : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(qmesh_world_create_mpi(nullptr, nullptr, &world_), QMESH_OK) << qmesh_last_error();
    ASSERT_EQ(qmesh_world_rank(world_, &rank_), QMESH_OK);
    ASSERT_EQ(qmesh_world_size(world_, &size_), QMESH_OK);
    ASSERT_EQ(size_, 2);
    const qmesh_mesh_axis axes[2] = {{"dp", 1}, {"tp", 2}};
    ASSERT_EQ(qmesh_mesh_create(world_, axes, 2, nullptr, &mesh_), QMESH_OK) << qmesh_last_error();
    qmesh_context_config config;
    qmesh_context_config_init(&config);
    ASSERT_EQ(qmesh_context_create(mesh_, &config, &ctx_), QMESH_OK) << qmesh_last_error();
  }
  void TearDown() override {
    EXPECT_EQ(qmesh_context_destroy(ctx_), QMESH_OK);
    EXPECT_EQ(qmesh_mesh_destroy(mesh_), QMESH_OK);
    EXPECT_EQ(qmesh_world_destroy(world_), QMESH_OK);
  }

  // A LayerNormMLP block (hidden 16, ffn 32, tp 2) on the context; nullptr on failure.
  qmesh_layernorm_mlp* small_block() {
    qmesh_layernorm_mlp_config config;
    qmesh_layernorm_mlp_config_init(&config);
    config.hidden = 16;
    config.ffn = 32;
    qmesh_layernorm_mlp* block = nullptr;
    EXPECT_EQ(qmesh_layernorm_mlp_create(ctx_, "b", &config, &block), QMESH_OK)
        << qmesh_last_error();
    return block;
  }
  // The block's forward (backward) on 4 tokens of fixed values.
  qmesh_status forward(qmesh_layernorm_mlp* block) {
    const qmesh_tensor xt = qmesh_host_tensor(x_.data(), QMESH_FLOAT32, 2, kTokensShape);
    qmesh_tensor y{};
    return qmesh_layernorm_mlp_forward(block, &xt, &y);
  }
  qmesh_status backward(qmesh_layernorm_mlp* block) {
    const qmesh_tensor dyt = qmesh_host_tensor(dy_.data(), QMESH_FLOAT32, 2, kTokensShape);
    qmesh_tensor dx{};
    return qmesh_layernorm_mlp_backward(block, &dyt, &dx);
  }

  static constexpr int64_t kTokensShape[2] = {4, 16};
  std::vector<float> x_ = std::vector<float>(64, 0.5f), dy_ = std::vector<float>(64, 0.01f);
  qmesh_world* world_ = nullptr;
  qmesh_mesh* mesh_ = nullptr;
  qmesh_context* ctx_ = nullptr;
  int rank_ = -1, size_ = 0;
};

TEST_F(CApi, VersionMatchesHeader) {
  EXPECT_EQ(qmesh_version(), QMESH_C_API_VERSION);
  EXPECT_THAT(std::string(qmesh_build_info()), HasSubstr("qmesh 0.1.0"));
  EXPECT_STREQ(qmesh_status_name(QMESH_ERROR_INVALID_ARGUMENT), "invalid argument");
}

TEST_F(CApi, NullHandlesAndPointers) {
  int n = 0;
  EXPECT_STATUS(qmesh_world_rank(nullptr, &n), QMESH_ERROR_INVALID_ARGUMENT, "world is NULL");
  EXPECT_STATUS(qmesh_world_rank(world_, nullptr), QMESH_ERROR_INVALID_ARGUMENT, "rank is NULL");
  EXPECT_STATUS(qmesh_mesh_create(world_, nullptr, 2, nullptr, &mesh_),
                QMESH_ERROR_INVALID_ARGUMENT, "axes is NULL");
  EXPECT_STATUS(qmesh_context_end_step(nullptr), QMESH_ERROR_INVALID_ARGUMENT,
                "qmesh_context_end_step: context is NULL");
  EXPECT_STATUS(qmesh_layernorm_mlp_forward(nullptr, nullptr, nullptr),
                QMESH_ERROR_INVALID_ARGUMENT, "qmesh_layernorm_mlp_forward: layer is NULL");
  EXPECT_STATUS(qmesh_dense_backward(nullptr, nullptr, nullptr), QMESH_ERROR_INVALID_ARGUMENT,
                "qmesh_dense_backward: layer is NULL");
  EXPECT_STATUS(qmesh_optimizer_step(nullptr), QMESH_ERROR_INVALID_ARGUMENT, "opt is NULL");
  EXPECT_STATUS(qmesh_grad_sync_finish(nullptr), QMESH_ERROR_INVALID_ARGUMENT, "sync is NULL");
  EXPECT_STATUS(qmesh_parameter_name(nullptr, nullptr), QMESH_ERROR_INVALID_ARGUMENT, "NULL");
  EXPECT_STATUS(qmesh_mesh_coord(mesh_, nullptr, &n), QMESH_ERROR_INVALID_ARGUMENT, "axis is NULL");
  qmesh_parameter* none[1] = {nullptr};
  qmesh_optimizer* opt = nullptr;
  EXPECT_STATUS(qmesh_optimizer_create_sgd(none, 1, nullptr, nullptr, &opt),
                QMESH_ERROR_INVALID_ARGUMENT, "qmesh_sgd_config is NULL");
  EXPECT_EQ(opt, nullptr);  // out-parameters untouched on failure
  // Destroying NULL is a no-op.
  EXPECT_EQ(qmesh_world_destroy(nullptr), QMESH_OK);
  EXPECT_EQ(qmesh_optimizer_destroy(nullptr), QMESH_OK);
}

TEST_F(CApi, StructSizesAndEnums) {
  qmesh_context_config config;
  qmesh_context_config_init(&config);
  qmesh_context* ctx = nullptr;
  config.struct_size = 8;
  EXPECT_STATUS(qmesh_context_create(mesh_, &config, &ctx), QMESH_ERROR_INVALID_ARGUMENT,
                "qmesh_context_config.struct_size is 8");
  config.struct_size = sizeof(config) + 16;  // a newer header than this library
  EXPECT_STATUS(qmesh_context_create(mesh_, &config, &ctx), QMESH_ERROR_INVALID_ARGUMENT,
                "set it to sizeof(qmesh_context_config)");
  qmesh_context_config_init(&config);
  config.recipe = static_cast<qmesh_recipe>(7);
  EXPECT_STATUS(qmesh_context_create(mesh_, &config, &ctx), QMESH_ERROR_INVALID_ARGUMENT,
                "config.recipe is 7");
  qmesh_context_config_init(&config);
  config.amax_history_len = 0;  // the library's own validation
  EXPECT_STATUS(qmesh_context_create(mesh_, &config, &ctx), QMESH_ERROR_INVALID_ARGUMENT,
                "history");
  EXPECT_EQ(ctx, nullptr);
  qmesh_adamw_config adamw;
  qmesh_adamw_config_init(&adamw);
  adamw.struct_size = 0;
  qmesh_optimizer* opt = nullptr;
  EXPECT_STATUS(qmesh_optimizer_create_adamw(nullptr, 0, &adamw, nullptr, &opt),
                QMESH_ERROR_INVALID_ARGUMENT, "qmesh_adamw_config.struct_size is 0");
  float v = 0;
  const int64_t one = 1;
  qmesh_tensor t = qmesh_host_tensor(&v, QMESH_FLOAT32, 1, &one);
  EXPECT_STATUS(qmesh_world_all_reduce(world_, &t, static_cast<qmesh_reduce_op>(9)),
                QMESH_ERROR_INVALID_ARGUMENT, "op is 9");
}

TEST_F(CApi, TensorDescriptions) {
  std::vector<float> a(6), b(6);
  const int64_t shape[2] = {2, 3};
  qmesh_tensor dst = qmesh_host_tensor(a.data(), QMESH_FLOAT32, 2, shape);
  qmesh_tensor src = qmesh_host_tensor(b.data(), QMESH_FLOAT32, 2, shape);
  const int64_t transposed[2] = {1, 2};
  src.strides = transposed;
  EXPECT_STATUS(qmesh_tensor_copy(&dst, &src), QMESH_ERROR_INVALID_ARGUMENT,
                "src.strides[1] is 2; qmesh takes dense row-major tensors");
  const int64_t dense[2] = {3, 1};
  src.strides = dense;
  EXPECT_EQ(qmesh_tensor_copy(&dst, &src), QMESH_OK) << qmesh_last_error();
  src.ndim = 9;
  EXPECT_STATUS(qmesh_tensor_copy(&dst, &src), QMESH_ERROR_INVALID_ARGUMENT, "src.ndim is 9");
  src = qmesh_host_tensor(nullptr, QMESH_FLOAT32, 2, shape);
  EXPECT_STATUS(qmesh_tensor_copy(&dst, &src), QMESH_ERROR_INVALID_ARGUMENT, "src.data is NULL");
  src = qmesh_host_tensor(b.data(), QMESH_FLOAT32, 2, shape);
  src.shape[0] = -2;
  EXPECT_STATUS(qmesh_tensor_copy(&dst, &src), QMESH_ERROR_INVALID_ARGUMENT, "src.shape[0] is -2");
  src.shape[0] = 3;
  src.shape[1] = 2;
  EXPECT_STATUS(qmesh_tensor_copy(&dst, &src), QMESH_ERROR_INVALID_ARGUMENT, "[3, 2]");
  src.dtype = static_cast<qmesh_dtype>(42);
  EXPECT_STATUS(qmesh_tensor_copy(&dst, &src), QMESH_ERROR_INVALID_ARGUMENT, "src.dtype is 42");
  EXPECT_EQ(qmesh_tensor_nbytes(&dst), 24u);
}

TEST_F(CApi, ShapesThatDoNotDivide) {
  qmesh_layernorm_mlp_config config;
  qmesh_layernorm_mlp_config_init(&config);
  config.hidden = 16;
  config.ffn = 33;  // tp = 2
  qmesh_layernorm_mlp* block = nullptr;
  EXPECT_STATUS(qmesh_layernorm_mlp_create(ctx_, "b", &config, &block),
                QMESH_ERROR_INVALID_ARGUMENT, "33");
  EXPECT_EQ(block, nullptr);
  config.ffn = 32;
  ASSERT_EQ(qmesh_layernorm_mlp_create(ctx_, "b", &config, &block), QMESH_OK) << qmesh_last_error();
  std::vector<float> x(4 * 17);
  const int64_t shape[2] = {4, 17};  // hidden is 16
  const qmesh_tensor xt = qmesh_host_tensor(x.data(), QMESH_FLOAT32, 2, shape);
  qmesh_tensor y{};
  EXPECT_STATUS(qmesh_layernorm_mlp_forward(block, &xt, &y), QMESH_ERROR_INVALID_ARGUMENT, "17");
  qmesh_parameter* p = nullptr;
  EXPECT_STATUS(qmesh_layernorm_mlp_parameter(block, 99, &p), QMESH_ERROR_INVALID_ARGUMENT,
                "parameter index 99 is out of range");
  EXPECT_EQ(qmesh_layernorm_mlp_destroy(block), QMESH_OK);
}

// The block-scaling recipe through the C API: its config fields and defaults, a bad format
// value, the overlap it refuses, a column-parallel layer whose shard would cut a 128x128 tile,
// and one forward/backward/end_step at tp = 2.
TEST_F(CApi, BlockRecipe) {
  qmesh_context_config cc;
  qmesh_context_config_init(&cc);
  EXPECT_EQ(cc.block_format, QMESH_FP8_E4M3);
  EXPECT_EQ(cc.block_power_of_two_scales, 1);
  cc.recipe = QMESH_RECIPE_FP8_BLOCK;
  qmesh_context* ctx = nullptr;
  cc.block_format = static_cast<qmesh_fp8_format>(7);
  EXPECT_STATUS(qmesh_context_create(mesh_, &cc, &ctx), QMESH_ERROR_INVALID_ARGUMENT,
                "config.block_format is 7");
  cc.block_format = QMESH_FP8_E4M3;
  ASSERT_EQ(qmesh_context_create(mesh_, &cc, &ctx), QMESH_OK) << qmesh_last_error();
  qmesh_dense_config dc;
  qmesh_dense_config_init(&dc);
  dc.in_features = 128;
  dc.out_features = 192;
  dc.parallelism = QMESH_DENSE_COLUMN;
  qmesh_dense* layer = nullptr;
  EXPECT_STATUS(qmesh_dense_create(ctx, "d", &dc, &layer), QMESH_ERROR_INVALID_ARGUMENT,
                "cuts a 128-wide scaling block");
  dc.out_features = 256;
  ASSERT_EQ(qmesh_dense_create(ctx, "d", &dc, &layer), QMESH_OK) << qmesh_last_error();
  constexpr int64_t T = 8;
  std::vector<float> x(T * 128), dy(T * 128);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 13) - 6) * 0.5f;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(int(i % 7) - 3) * 0.25f;
  const int64_t shape[2] = {T, 128};
  const qmesh_tensor xt = qmesh_host_tensor(x.data(), QMESH_FLOAT32, 2, shape);
  const qmesh_tensor dyt = qmesh_host_tensor(dy.data(), QMESH_FLOAT32, 2, shape);
  qmesh_tensor y{}, dx{};
  ASSERT_EQ(qmesh_dense_forward(layer, &xt, &y), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(y.shape[1], 128);
  double norm = 0;
  for (int64_t i = 0; i < T * 128; ++i) norm += std::abs(static_cast<const float*>(y.data)[i]);
  EXPECT_GT(norm, 0.0);
  ASSERT_EQ(qmesh_dense_backward(layer, &dyt, &dx), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(qmesh_context_end_step(ctx), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(qmesh_dense_destroy(layer), QMESH_OK);
  EXPECT_EQ(qmesh_context_destroy(ctx), QMESH_OK);
}

// The NVFP4 recipe through the C API: its config fields and defaults, a program built before
// them (a smaller struct_size) gets the defaults, the error without emulation, and one
// emulated forward/backward/end_step of a column-parallel layer at tp = 2.
TEST_F(CApi, Nvfp4Recipe) {
  qmesh_context_config cc;
  qmesh_context_config_init(&cc);
  EXPECT_EQ(cc.nvfp4_disable_rht, 0);
  EXPECT_EQ(cc.nvfp4_disable_stochastic_rounding, 0);
  EXPECT_EQ(cc.nvfp4_disable_2d_quantization, 0);
  EXPECT_EQ(cc.emulate, 0);
  cc.recipe = QMESH_RECIPE_NVFP4;
  qmesh_context* ctx = nullptr;
  cc.struct_size = offsetof(qmesh_context_config, nvfp4_disable_rht);
  ASSERT_EQ(qmesh_context_create(mesh_, &cc, &ctx), QMESH_OK) << qmesh_last_error();
  qmesh_dense_config dc;
  qmesh_dense_config_init(&dc);
  dc.in_features = 64;
  dc.out_features = 64;
  dc.parallelism = QMESH_DENSE_COLUMN;
  qmesh_dense* layer = nullptr;
  ASSERT_EQ(qmesh_dense_create(ctx, "d", &dc, &layer), QMESH_OK) << qmesh_last_error();
  constexpr int64_t T = 16;
  std::vector<float> x(T * 64), dy(T * 32);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 13) - 6) * 0.5f;
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = float(int(i % 7) - 3) * 0.25f;
  const int64_t x_shape[2] = {T, 64}, dy_shape[2] = {T, 32};
  const qmesh_tensor xt = qmesh_host_tensor(x.data(), QMESH_FLOAT32, 2, x_shape);
  const qmesh_tensor dyt = qmesh_host_tensor(dy.data(), QMESH_FLOAT32, 2, dy_shape);
  qmesh_tensor y{}, dx{};
  EXPECT_STATUS(qmesh_dense_forward(layer, &xt, &y), QMESH_ERROR_UNSUPPORTED,
                "NVFP4BlockScaling(emulate=True)");
  EXPECT_EQ(qmesh_dense_destroy(layer), QMESH_OK);
  EXPECT_EQ(qmesh_context_destroy(ctx), QMESH_OK);
  qmesh_context_config_init(&cc);
  cc.recipe = QMESH_RECIPE_NVFP4;
  cc.emulate = 1;
  ASSERT_EQ(qmesh_context_create(mesh_, &cc, &ctx), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(qmesh_dense_create(ctx, "d", &dc, &layer), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(qmesh_dense_forward(layer, &xt, &y), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(y.shape[1], 32);
  double norm = 0;
  for (int64_t i = 0; i < T * 32; ++i) norm += std::abs(static_cast<const float*>(y.data)[i]);
  EXPECT_GT(norm, 0.0);
  ASSERT_EQ(qmesh_dense_backward(layer, &dyt, &dx), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(qmesh_context_end_step(ctx), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(qmesh_dense_destroy(layer), QMESH_OK);
  EXPECT_EQ(qmesh_context_destroy(ctx), QMESH_OK);
}

// Column- and row-parallel Dense (tp = 2, fp32 GEMMs) against float64 sums computed here
// from the layers' own weight shards; shapes that do not divide fail.
TEST_F(CApi, DenseMatchesFloat64Reference) {
  qmesh_context_config cc;
  qmesh_context_config_init(&cc);
  cc.recipe = QMESH_RECIPE_FP32;
  qmesh_context* ctx = nullptr;
  ASSERT_EQ(qmesh_context_create(mesh_, &cc, &ctx), QMESH_OK) << qmesh_last_error();
  constexpr int64_t T = 3, in = 8, out = 6;
  std::vector<float> x(T * in);
  for (size_t i = 0; i < x.size(); ++i) x[i] = float(int(i % 11) - 5) * 0.25f;
  auto weight_of = [](qmesh_dense* layer) {
    qmesh_parameter* w = nullptr;
    EXPECT_EQ(qmesh_dense_parameter(layer, 0, &w), QMESH_OK);
    qmesh_tensor t{};
    EXPECT_EQ(qmesh_parameter_value(w, &t), QMESH_OK);
    return t;
  };
  for (const auto parallelism : {QMESH_DENSE_COLUMN, QMESH_DENSE_ROW}) {
    qmesh_dense_config dc;
    qmesh_dense_config_init(&dc);
    dc.in_features = in;
    dc.out_features = out;
    dc.parallelism = parallelism;
    dc.seed = 5;
    qmesh_dense* layer = nullptr;
    ASSERT_EQ(qmesh_dense_create(ctx, "d", &dc, &layer), QMESH_OK) << qmesh_last_error();
    int count = 0;
    ASSERT_EQ(qmesh_dense_parameter_count(layer, &count), QMESH_OK);
    EXPECT_EQ(count, 2);  // weight, bias (zero at start)
    const qmesh_tensor w = weight_of(layer);
    const bool column = parallelism == QMESH_DENSE_COLUMN;
    // The global weight [out, in], gathered from both ranks' shards.
    std::vector<float> shards(size_t(out * in));
    const int64_t shard_elems = out * in / 2;
    qmesh_tensor mine = w;
    mine.ndim = 1;
    mine.shape[0] = shard_elems;
    const int64_t all_elems = out * in;
    qmesh_tensor all = qmesh_host_tensor(shards.data(), QMESH_FLOAT32, 1, &all_elems);
    ASSERT_EQ(qmesh_world_all_gather(world_, &mine, &all), QMESH_OK) << qmesh_last_error();
    auto global_w = [&](int64_t o, int64_t k) {
      if (column) return double(shards[size_t(o * in + k)]);  // row shards stack in order
      const int64_t r = k / (in / 2), kk = k % (in / 2);
      return double(shards[size_t(r * shard_elems + o * (in / 2) + kk)]);
    };
    // Row parallel: this rank's input is its half of x's columns.
    std::vector<float> x_local;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < in; ++k)
        if (column || k / (in / 2) == rank_) x_local.push_back(x[size_t(t * in + k)]);
    const int64_t xshape[2] = {T, column ? in : in / 2};
    const qmesh_tensor xt = qmesh_host_tensor(x_local.data(), QMESH_FLOAT32, 2, xshape);
    qmesh_tensor y{};
    ASSERT_EQ(qmesh_dense_forward(layer, &xt, &y), QMESH_OK) << qmesh_last_error();
    const int64_t out_local = column ? out / 2 : out;
    ASSERT_EQ(y.ndim, 2);
    ASSERT_EQ(y.shape[0], T);
    ASSERT_EQ(y.shape[1], out_local);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out_local; ++o) {
        const int64_t og = column ? rank_ * out_local + o : o;
        double ref = 0;
        for (int64_t k = 0; k < in; ++k) ref += double(x[size_t(t * in + k)]) * global_w(og, k);
        EXPECT_NEAR(static_cast<const float*>(y.data)[t * out_local + o], ref, 1e-5)
            << "t " << t << " o " << og << (column ? " column" : " row");
      }
    EXPECT_EQ(qmesh_dense_destroy(layer), QMESH_OK);
  }
  qmesh_dense_config dc;
  qmesh_dense_config_init(&dc);
  dc.in_features = in;
  dc.out_features = 5;
  dc.parallelism = QMESH_DENSE_COLUMN;
  qmesh_dense* layer = nullptr;
  EXPECT_STATUS(qmesh_dense_create(ctx, "d", &dc, &layer), QMESH_ERROR_INVALID_ARGUMENT, "5");
  dc.parallelism = static_cast<qmesh_dense_parallelism>(3);
  EXPECT_STATUS(qmesh_dense_create(ctx, "d", &dc, &layer), QMESH_ERROR_INVALID_ARGUMENT,
                "config.parallelism is 3");
  EXPECT_EQ(layer, nullptr);
  EXPECT_EQ(qmesh_context_destroy(ctx), QMESH_OK);
}

// E4M3 byte -> value, written out here (sign, 4-bit exponent with bias 7, 3-bit mantissa).
double e4m3(uint8_t b) {
  const int e = (b >> 3) & 15, m = b & 7;
  const double v = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (b & 0x80) ? -v : v;
}

// GEMM plans (fp32 with a bias epilogue, FP8 codes with scale_inv) against float64 sums
// computed here; quantization against hand-encoded E4M3 codes; bad arguments fail.
TEST(CApiGemm, PlansMatchFloat64Reference) {
  // fp32, TN: D [2, 4] = A [2, 3] · B[4, 3]ᵀ + bias [4]; the plan runs again on new A values.
  std::vector<float> a(6), b(12), bias(4), d(8);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.5f - 1.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = float(int(i % 5) - 2);
  for (size_t i = 0; i < bias.size(); ++i) bias[i] = float(i) * 0.25f;
  const int64_t sa[2] = {2, 3}, sb[2] = {4, 3}, sd[2] = {2, 4}, sbias[1] = {4};
  const qmesh_tensor at = qmesh_host_tensor(a.data(), QMESH_FLOAT32, 2, sa);
  const qmesh_tensor bt = qmesh_host_tensor(b.data(), QMESH_FLOAT32, 2, sb);
  const qmesh_tensor biast = qmesh_host_tensor(bias.data(), QMESH_FLOAT32, 1, sbias);
  qmesh_gemm_args args;
  qmesh_gemm_args_init(&args);
  args.a.plain = &at;
  args.b.plain = &bt;
  args.d = qmesh_host_tensor(d.data(), QMESH_FLOAT32, 2, sd);
  args.epilogue = QMESH_GEMM_EPILOGUE_BIAS;
  args.bias = &biast;
  qmesh_gemm_plan* plan = nullptr;
  ASSERT_EQ(qmesh_gemm_plan_create(&args, nullptr, &plan), QMESH_OK) << qmesh_last_error();
  for (int round = 0; round < 2; ++round) {
    if (round == 1)
      for (auto& v : a) v = -v * 2.0f;
    ASSERT_EQ(qmesh_gemm_plan_run(plan, nullptr), QMESH_OK) << qmesh_last_error();
    for (int m = 0; m < 2; ++m)
      for (int n = 0; n < 4; ++n) {
        double ref = bias[size_t(n)];
        for (int k = 0; k < 3; ++k) ref += double(a[size_t(m * 3 + k)]) * b[size_t(n * 3 + k)];
        EXPECT_NEAR(d[size_t(m * 4 + n)], ref, 1e-5) << "round " << round;
      }
  }
  EXPECT_EQ(qmesh_gemm_plan_destroy(plan), QMESH_OK);

  // FP8 E4M3 x E4M3 with scale_inv 0.5 and 2: D = (codes_a * 0.5) · (codes_b * 2)ᵀ.
  const uint8_t ca[6] = {0x38, 0x40, 0x3C, 0xB8, 0x30, 0x00};
  const uint8_t cb[12] = {0x38, 0x38, 0x38, 0x40, 0xB8, 0x30, 0x3C, 0x00, 0xC0, 0x44, 0x34, 0x38};
  float sa_inv = 0.5f, sb_inv = 2.0f, scale_a = 2.0f, scale_b = 0.5f, amax_a = 0, amax_b = 0;
  qmesh_quantized_tensor qa{}, qb{};
  qa.data = qmesh_host_tensor(const_cast<uint8_t*>(ca), QMESH_FLOAT8_E4M3, 2, sa);
  qa.scale = &scale_a;
  qa.scale_inv = &sa_inv;
  qa.amax = &amax_a;
  qb.data = qmesh_host_tensor(const_cast<uint8_t*>(cb), QMESH_FLOAT8_E4M3, 2, sb);
  qb.scale = &scale_b;
  qb.scale_inv = &sb_inv;
  qb.amax = &amax_b;
  qmesh_gemm_args_init(&args);
  args.a.fp8 = &qa;
  args.b.fp8 = &qb;
  args.d = qmesh_host_tensor(d.data(), QMESH_FLOAT32, 2, sd);
  ASSERT_EQ(qmesh_gemm_plan_create(&args, nullptr, &plan), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(qmesh_gemm_plan_run(plan, nullptr), QMESH_OK) << qmesh_last_error();
  for (int m = 0; m < 2; ++m)
    for (int n = 0; n < 4; ++n) {
      double ref = 0;
      for (int k = 0; k < 3; ++k) ref += e4m3(ca[m * 3 + k]) * 0.5 * e4m3(cb[n * 3 + k]) * 2.0;
      EXPECT_EQ(double(d[size_t(m * 4 + n)]), ref) << m << "," << n;  // exact in fp32
    }
  EXPECT_EQ(qmesh_gemm_plan_destroy(plan), QMESH_OK);

  // E5M2 x E5M2 has no FP8 GEMM: unsupported (an Error of that kind), not a bad argument.
  qmesh_quantized_tensor qa5 = qa, qb5 = qb;
  qa5.data.dtype = QMESH_FLOAT8_E5M2;
  qb5.data.dtype = QMESH_FLOAT8_E5M2;
  args.a.fp8 = &qa5;
  args.b.fp8 = &qb5;
  plan = nullptr;
  EXPECT_STATUS(qmesh_gemm_plan_create(&args, nullptr, &plan), QMESH_ERROR_UNSUPPORTED,
                "fp8e5m2 × fp8e5m2 are not supported");
  EXPECT_EQ(plan, nullptr);

  // Quantize: 1, -2, 1.5 and 896 (saturates to 448) with scale 1.
  float x[4] = {1.0f, -2.0f, 1.5f, 896.0f};
  uint8_t codes[4] = {0, 0, 0, 0};
  float scale = 1.0f, scale_inv = 0.0f, amax = 0.0f;
  const int64_t s4[2] = {1, 4};
  const qmesh_tensor xt = qmesh_host_tensor(x, QMESH_FLOAT32, 2, s4);
  qmesh_quantized_tensor q{};
  q.data = qmesh_host_tensor(codes, QMESH_FLOAT8_E4M3, 2, s4);
  q.scale = &scale;
  q.scale_inv = &scale_inv;
  q.amax = &amax;
  ASSERT_EQ(qmesh_quantize(&xt, &q, nullptr), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(codes[0], 0x38);
  EXPECT_EQ(codes[1], 0xC0);
  EXPECT_EQ(codes[2], 0x3C);
  EXPECT_EQ(codes[3], 0x7E);
  EXPECT_EQ(e4m3(0x7E), 448.0);
  EXPECT_EQ(scale_inv, 1.0f);
  EXPECT_EQ(amax, 896.0f);

  // Bad arguments.
  plan = nullptr;
  qmesh_gemm_args_init(&args);
  args.a.plain = &at;
  args.a.fp8 = &qa;
  args.b.plain = &bt;
  args.d = qmesh_host_tensor(d.data(), QMESH_FLOAT32, 2, sd);
  EXPECT_STATUS(qmesh_gemm_plan_create(&args, nullptr, &plan), QMESH_ERROR_INVALID_ARGUMENT,
                "args.a: set exactly one of .plain and .fp8");
  args.a.fp8 = nullptr;
  const int64_t sbad[2] = {4, 2};  // K = 2 against A's 3
  const qmesh_tensor bad = qmesh_host_tensor(b.data(), QMESH_FLOAT32, 2, sbad);
  args.b.plain = &bad;
  EXPECT_EQ(qmesh_gemm_plan_create(&args, nullptr, &plan), QMESH_ERROR_INVALID_ARGUMENT);
  EXPECT_THAT(std::string(qmesh_last_error()), HasSubstr("qmesh_gemm_plan_create"));
  EXPECT_EQ(plan, nullptr);
  qa.scale_inv = nullptr;
  EXPECT_EQ(qmesh_quantize(&xt, &qa, nullptr), QMESH_ERROR_INVALID_ARGUMENT);
  EXPECT_STATUS(qmesh_gemm_plan_run(nullptr, nullptr), QMESH_ERROR_INVALID_ARGUMENT,
                "plan is NULL");
}

TEST_F(CApi, LastErrorIsPerThread) {
  EXPECT_EQ(qmesh_world_rank(nullptr, nullptr), QMESH_ERROR_INVALID_ARGUMENT);
  const std::string mine = qmesh_last_error();
  std::string theirs;
  std::thread([&] {
    EXPECT_STREQ(qmesh_last_error(), "");
    EXPECT_EQ(qmesh_optimizer_step(nullptr), QMESH_ERROR_INVALID_ARGUMENT);
    theirs = qmesh_last_error();
  }).join();
  EXPECT_EQ(qmesh_last_error(), mine);
  EXPECT_THAT(theirs, HasSubstr("qmesh_optimizer_step"));
}

TEST_F(CApi, CollectivesAndLossAgreeWithReference) {
  // all_reduce: sum of (rank + 1) over 2 ranks = 3; all_gather: rank order.
  double v = rank_ + 1.0;
  const int64_t one = 1, two = 2;
  qmesh_tensor t = qmesh_host_tensor(&v, QMESH_FLOAT64, 1, &one);
  ASSERT_EQ(qmesh_world_all_reduce(world_, &t, QMESH_SUM), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(v, 3.0);
  const char* tp[1] = {"tp"};
  v = rank_ * 10.0;
  ASSERT_EQ(qmesh_mesh_all_reduce(mesh_, tp, 1, &t, QMESH_MAX), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(v, 10.0);
  int32_t mine = 7 + rank_, all[2] = {0, 0};
  qmesh_tensor in = qmesh_host_tensor(&mine, QMESH_INT32, 1, &one);
  qmesh_tensor out = qmesh_host_tensor(all, QMESH_INT32, 1, &two);
  ASSERT_EQ(qmesh_world_all_gather(world_, &in, &out), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(all[0], 7);
  EXPECT_EQ(all[1], 8);
  // mse_loss against float64 computed here.
  float y[3] = {1.0f, -2.0f, 0.5f}, target[3] = {0.0f, 1.0f, 0.25f}, dy[3];
  double sum_sq = 0;
  const int64_t three = 3;
  qmesh_tensor yt = qmesh_host_tensor(y, QMESH_FLOAT32, 1, &three);
  qmesh_tensor tt = qmesh_host_tensor(target, QMESH_FLOAT32, 1, &three);
  qmesh_tensor dyt = qmesh_host_tensor(dy, QMESH_FLOAT32, 1, &three);
  qmesh_tensor st = qmesh_host_tensor(&sum_sq, QMESH_FLOAT64, 1, &one);
  ASSERT_EQ(qmesh_mse_loss(&yt, &tt, 6.0, &dyt, &st, nullptr), QMESH_OK) << qmesh_last_error();
  double expect = 0;
  for (int i = 0; i < 3; ++i) {
    const double d = double(y[i]) - double(target[i]);
    expect += d * d;
    EXPECT_EQ(dy[i], float(2.0 * d / 6.0));
  }
  EXPECT_EQ(sum_sq, expect);
  EXPECT_STATUS(qmesh_mse_loss(&yt, &tt, 2.0, &dyt, &st, nullptr), QMESH_ERROR_INVALID_ARGUMENT,
                "global_count");
  // The global loss on the dp 1 x tp 2 mesh: outputs replicated over tp count once (the mean
  // over 3 elements); split over tp, both ranks' count (y differs by rank there).
  double loss = -1;
  ASSERT_EQ(qmesh_mse_loss_global(mesh_, 0, &yt, &tt, &dyt, nullptr, &loss), QMESH_OK)
      << qmesh_last_error();
  EXPECT_NEAR(loss, expect / 3, 1e-15);
  EXPECT_EQ(dy[0], float(2.0 * (double(y[0]) - double(target[0])) / 3.0));
  y[0] = float(rank_);  // 0 and 1: errors 0 and 1
  double both = 0;
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 3; ++i) {
      const double d = double(i == 0 ? float(r) : y[i]) - double(target[i]);
      both += d * d;
    }
  ASSERT_EQ(qmesh_mse_loss_global(mesh_, 1, &yt, &tt, &dyt, nullptr, &loss), QMESH_OK)
      << qmesh_last_error();
  EXPECT_NEAR(loss, both / 6, 1e-15);
  EXPECT_STATUS(qmesh_mse_loss_global(nullptr, 0, &yt, &tt, &dyt, nullptr, &loss),
                QMESH_ERROR_INVALID_ARGUMENT, "mesh is NULL");
}

TEST_F(CApi, CheckpointErrors) {
  float v = 1.0f;
  const int64_t one = 1;
  qmesh_named_tensor tensors[1] = {{"v", qmesh_host_tensor(&v, QMESH_FLOAT32, 1, &one)}};
  int step = -1;
  int32_t pid = ::getpid();  // rank 0's names the directory every rank uses
  const qmesh_tensor pid_tensor = qmesh_host_tensor(&pid, QMESH_INT32, 1, &one);
  ASSERT_EQ(qmesh_world_all_reduce(world_, &pid_tensor, QMESH_MAX), QMESH_OK);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("qmesh_c_api_ckpt_" + std::to_string(pid)))
          .string();
  EXPECT_STATUS(qmesh_checkpoint_load_latest(world_, dir.c_str(), tensors, 1, nullptr, &step),
                QMESH_ERROR_INVALID_ARGUMENT, "no checkpoint to resume from");
  EXPECT_EQ(step, -1);
  tensors[0].name = nullptr;
  EXPECT_STATUS(qmesh_checkpoint_save(world_, dir.c_str(), 1, tensors, 1, nullptr),
                QMESH_ERROR_INVALID_ARGUMENT, "tensors[0].name is NULL");
  tensors[0].name = "v";
  EXPECT_STATUS(qmesh_checkpoint_save(world_, dir.c_str(), -1, tensors, 1, nullptr),
                QMESH_ERROR_INVALID_ARGUMENT, "step is negative");
  tensors[0].name = "scaling.v";  // the prefix of the scaling state's tensors
  EXPECT_STATUS(qmesh_checkpoint_save(world_, dir.c_str(), 1, tensors, 1, nullptr),
                QMESH_ERROR_INVALID_ARGUMENT, "which checkpoints keep for the FP8 scaling state");
  tensors[0].name = "v";
  EXPECT_STATUS(qmesh_checkpoint_save(world_, dir.c_str(), 1, tensors, 1, ctx_),
                QMESH_ERROR_INVALID_ARGUMENT,
                "no FP8 operands were registered");  // no layers yet
  // A round trip (collective), then a load into a tensor of another shape.
  v = 2.5f + float(rank_);
  ASSERT_EQ(qmesh_checkpoint_save(world_, dir.c_str(), 4, tensors, 1, nullptr), QMESH_OK)
      << qmesh_last_error();
  v = 0;
  ASSERT_EQ(qmesh_checkpoint_load_latest(world_, dir.c_str(), tensors, 1, nullptr, &step), QMESH_OK)
      << qmesh_last_error();
  EXPECT_EQ(step, 4);
  EXPECT_EQ(v, 2.5f + float(rank_));
  float w[2] = {0, 0};
  const int64_t two = 2;
  tensors[0].tensor = qmesh_host_tensor(w, QMESH_FLOAT32, 1, &two);
  EXPECT_EQ(qmesh_checkpoint_load_latest(world_, dir.c_str(), tensors, 1, nullptr, &step),
            QMESH_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(w[0], 0.0f);  // untouched
  ASSERT_EQ(qmesh_world_barrier(world_), QMESH_OK);
  if (rank_ == 0) std::filesystem::remove_all(dir);
}

// A forward after backward without qmesh_context_end_step (delayed scaling) fails, naming the
// missing call; with it, the next step runs.
TEST_F(CApi, ASkippedEndStepIsAnError) {
  qmesh_layernorm_mlp* block = small_block();
  ASSERT_NE(block, nullptr);
  ASSERT_EQ(forward(block), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(backward(block), QMESH_OK) << qmesh_last_error();
  EXPECT_STATUS(forward(block), QMESH_ERROR_INVALID_ARGUMENT,
                "without LayerContext::end_step() (qmesh_context_end_step) in between");
  ASSERT_EQ(qmesh_context_end_step(ctx_), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(forward(block), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(qmesh_layernorm_mlp_destroy(block), QMESH_OK);
}

// A training checkpoint in one call (context, parameters, optimizer state, the caller's
// tensors) round trips; loading is collective: a file missing on rank 1 fails on both ranks
// with the same message and changes nothing; a chosen step loads; the FP8 state cannot be
// left out at load.
TEST_F(CApi, TrainingCheckpointsLoadCollectively) {
  qmesh_layernorm_mlp* block = small_block();
  ASSERT_NE(block, nullptr);
  int np = 0;
  ASSERT_EQ(qmesh_layernorm_mlp_parameter_count(block, &np), QMESH_OK);
  std::vector<qmesh_parameter*> params(size_t(np), nullptr);
  for (int i = 0; i < np; ++i)
    ASSERT_EQ(qmesh_layernorm_mlp_parameter(block, i, &params[size_t(i)]), QMESH_OK);
  qmesh_sgd_config sc;
  qmesh_sgd_config_init(&sc);
  qmesh_optimizer* opt = nullptr;
  ASSERT_EQ(qmesh_optimizer_create_sgd(params.data(), np, &sc, nullptr, &opt), QMESH_OK);
  EXPECT_STATUS(qmesh_optimizer_set_lr(opt, 0.0f), QMESH_ERROR_INVALID_ARGUMENT,
                "SGD learning rate must be > 0");
  EXPECT_EQ(qmesh_optimizer_set_lr(opt, 0.02f), QMESH_OK);
  ASSERT_EQ(forward(block), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(backward(block), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(qmesh_context_end_step(ctx_), QMESH_OK) << qmesh_last_error();
  ASSERT_EQ(qmesh_optimizer_step(opt), QMESH_OK) << qmesh_last_error();

  int32_t pid = ::getpid();
  const int64_t one = 1;
  const qmesh_tensor pid_tensor = qmesh_host_tensor(&pid, QMESH_INT32, 1, &one);
  ASSERT_EQ(qmesh_world_all_reduce(world_, &pid_tensor, QMESH_MAX), QMESH_OK);
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("qmesh_c_api_train_" + std::to_string(pid)))
          .string();
  int32_t tag = 7 + rank_;
  const qmesh_named_tensor extra[1] = {{"run.tag", qmesh_host_tensor(&tag, QMESH_INT32, 1, &one)}};
  ASSERT_EQ(qmesh_checkpoint_save_training(world_, dir.c_str(), 3, ctx_, params.data(), np, opt,
                                           extra, 1),
            QMESH_OK)
      << qmesh_last_error();
  qmesh_tensor w{};
  ASSERT_EQ(qmesh_parameter_value(params[0], &w), QMESH_OK);
  float* w0 = static_cast<float*>(w.data);
  const float saved = *w0;
  *w0 = 1234.0f;
  tag = 0;
  int step = -1;
  ASSERT_EQ(qmesh_checkpoint_load_training(world_, dir.c_str(), 3, ctx_, params.data(), np, opt,
                                           extra, 1, &step),
            QMESH_OK)
      << qmesh_last_error();
  EXPECT_EQ(step, 3);
  EXPECT_EQ(*w0, saved);
  EXPECT_EQ(tag, 7 + rank_);
  EXPECT_STATUS(qmesh_checkpoint_load_training(world_, dir.c_str(), 9, ctx_, params.data(), np, opt,
                                               extra, 1, &step),
                QMESH_ERROR_INVALID_ARGUMENT, "no checkpoint of step 9");
  EXPECT_STATUS(qmesh_checkpoint_load_training(world_, dir.c_str(), -2, ctx_, params.data(), np,
                                               opt, extra, 1, &step),
                QMESH_ERROR_INVALID_ARGUMENT, "step is negative (-2)");
  // Without the context, the checkpoint's FP8 state would be dropped: an error.
  const qmesh_named_tensor tensors[1] = {extra[0]};
  EXPECT_STATUS(qmesh_checkpoint_load(world_, dir.c_str(), 3, tensors, 1, nullptr, &step),
                QMESH_ERROR_INVALID_ARGUMENT, "pass the LayerContext");
  // Rank 1's file goes missing: both ranks fail alike, neither loads.
  ASSERT_EQ(qmesh_world_barrier(world_), QMESH_OK);
  if (rank_ == 1) std::filesystem::remove(dir + "/step-3/rank-1.tensors");
  ASSERT_EQ(qmesh_world_barrier(world_), QMESH_OK);
  *w0 = 1234.0f;
  EXPECT_STATUS(qmesh_checkpoint_load_training(world_, dir.c_str(), -1, ctx_, params.data(), np,
                                               opt, extra, 1, &step),
                QMESH_ERROR_INVALID_ARGUMENT, "failed on rank 1 of 2 (no rank changed its state)");
  EXPECT_THAT(std::string(qmesh_last_error()), HasSubstr("rank-1.tensors"));
  EXPECT_EQ(*w0, 1234.0f);
  ASSERT_EQ(qmesh_world_barrier(world_), QMESH_OK);
  if (rank_ == 0) std::filesystem::remove_all(dir);
  EXPECT_EQ(qmesh_optimizer_destroy(opt), QMESH_OK);
  EXPECT_EQ(qmesh_layernorm_mlp_destroy(block), QMESH_OK);
}

// A world bootstrapped through a directory (UCX), the two MPI ranks joining it as ranks 0
// and 1: its all-reduce sums both.
TEST_F(CApi, StoreBootstrappedWorld) {
  int32_t pid = ::getpid();
  const int64_t one = 1;
  const qmesh_tensor pid_tensor = qmesh_host_tensor(&pid, QMESH_INT32, 1, &one);
  ASSERT_EQ(qmesh_world_all_reduce(world_, &pid_tensor, QMESH_MAX), QMESH_OK);
  const auto dir =
      std::filesystem::temp_directory_path() / ("qmesh_c_api_store_" + std::to_string(pid));
  qmesh_world* store_world = nullptr;
  const qmesh_status status = qmesh_world_create_store(rank_, 2, dir.c_str(), &store_world);
  if (status == QMESH_ERROR_UNSUPPORTED) GTEST_SKIP() << qmesh_last_error();
  ASSERT_EQ(status, QMESH_OK) << qmesh_last_error();
  int rank = -1, size = 0;
  EXPECT_EQ(qmesh_world_rank(store_world, &rank), QMESH_OK);
  EXPECT_EQ(qmesh_world_size(store_world, &size), QMESH_OK);
  EXPECT_EQ(rank, rank_);
  EXPECT_EQ(size, 2);
  double v = 10.0 * (rank_ + 1);
  const qmesh_tensor t = qmesh_host_tensor(&v, QMESH_FLOAT64, 1, &one);
  ASSERT_EQ(qmesh_world_all_reduce(store_world, &t, QMESH_SUM), QMESH_OK) << qmesh_last_error();
  EXPECT_EQ(v, 30.0);
  EXPECT_EQ(qmesh_world_barrier(store_world), QMESH_OK);
  EXPECT_EQ(qmesh_world_destroy(store_world), QMESH_OK);
  ASSERT_EQ(qmesh_world_barrier(world_), QMESH_OK);
  if (rank_ == 0) std::filesystem::remove_all(dir);
}

// A peer that never joins: the store bootstrap gives up after the comm timeout
// (QMESH_COMM_TIMEOUT_S) with a status and a message, instead of hanging.
TEST_F(CApi, PeerThatNeverComes) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("qmesh_c_api_test_" + std::to_string(::getpid()));
  qmesh_world* world = nullptr;
  const qmesh_status status = qmesh_world_create_store(0, 2, dir.c_str(), &world);
  std::filesystem::remove_all(dir);
  if (status == QMESH_ERROR_UNSUPPORTED) GTEST_SKIP() << qmesh_last_error();
  EXPECT_EQ(status, QMESH_ERROR_FAILED) << qmesh_last_error();
  EXPECT_THAT(std::string(qmesh_last_error()), HasSubstr("qmesh_world_create_store"));
  EXPECT_EQ(world, nullptr);
  EXPECT_STATUS(qmesh_world_create_store(2, 2, dir.c_str(), &world), QMESH_ERROR_INVALID_ARGUMENT,
                "0 <= rank < size");
}

}  // namespace
