// GPU throughput of the fused casts against the measured device-to-device copy bandwidth
// (bytes read + written in both cases; target >= 90 % of the copy): cast_transpose + amax from
// bf16 and fp32 to e4m3 and e5m2, the GELU-fused casts of the LayerNormMLP step
// (gelu_cast_transpose, dgelu_dbias_cast_transpose), LayerNorm fused with the cast
// (norm_forward), the block-scaled casts with their columnwise copy (block_quantize, 1x128 and
// 128x128 blocks), current scaling's amax passes (amax, gelu_amax, dgelu_amax: bytes read
// only, on normally distributed data); and the latency of the fused
// delayed-scaling update of 1000 tensors x history 1024. Prints a table, then one JSON object
// (also to --json FILE). --case NAME runs only the casts whose name contains NAME, once each
// after one warm-up (for a profiler: ncu). Without a GPU it says "no GPU" and exits 0.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench_util.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/copy.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/float16.h"
#include "qmesh/ops/activation_cast.h"
#include "qmesh/ops/amax.h"
#include "qmesh/ops/block_quantize.h"
#include "qmesh/ops/cast_transpose.h"
#include "qmesh/ops/norm_forward.h"
#include "qmesh/scaling/scaling_states.h"

namespace {

using qmesh::Device;
using qmesh::DType;
using qmesh::Shape;

constexpr int kWarmup = 5;
constexpr int kIters = 50;

// Mean milliseconds of fn() over `iters` launches on the default stream (after kWarmup, or
// one warm-up launch for a single timed one).
template <class Fn>
double time_ms(Fn&& fn, int iters) {
  for (int i = 0; i < (iters == 1 ? 1 : kWarmup); ++i) fn();
  cudaEvent_t start, stop;
  QMESH_CHECK_CUDA(cudaEventCreate(&start));
  QMESH_CHECK_CUDA(cudaEventCreate(&stop));
  QMESH_CHECK_CUDA(cudaEventRecord(start));
  for (int i = 0; i < iters; ++i) fn();
  QMESH_CHECK_CUDA(cudaEventRecord(stop));
  QMESH_CHECK_CUDA(cudaEventSynchronize(stop));
  float ms = 0;
  QMESH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
  QMESH_CHECK_CUDA(cudaEventDestroy(start));
  QMESH_CHECK_CUDA(cudaEventDestroy(stop));
  return ms / iters;
}

enum class Kind {
  kCastTranspose,
  kGelu,
  kDgelu,
  kBlock1x128,
  kBlock128x128,
  kLayerNorm,
  kAmax,
  kGeluAmax,
  kDgeluAmax
};

struct Case {
  const char* name;
  Kind kind;
  DType in, fp8;
  int64_t rows, cols;
};

const Case kCases[] = {
    {"cast_transpose bf16->e4m3 8192x8192", Kind::kCastTranspose, DType::kBFloat16,
     DType::kFloat8E4M3, 8192, 8192},
    {"cast_transpose bf16->e4m3 8192x4096", Kind::kCastTranspose, DType::kBFloat16,
     DType::kFloat8E4M3, 8192, 4096},
    {"cast_transpose bf16->e4m3 8192x16384", Kind::kCastTranspose, DType::kBFloat16,
     DType::kFloat8E4M3, 8192, 16384},
    {"cast_transpose fp32->e4m3 8192x8192", Kind::kCastTranspose, DType::kFloat32,
     DType::kFloat8E4M3, 8192, 8192},
    {"cast_transpose bf16->e5m2 8192x8192", Kind::kCastTranspose, DType::kBFloat16,
     DType::kFloat8E5M2, 8192, 8192},
    {"cast_transpose fp32->e5m2 8192x8192", Kind::kCastTranspose, DType::kFloat32,
     DType::kFloat8E5M2, 8192, 8192},
    {"gelu_cast_transpose fp32->e4m3 8192x16384", Kind::kGelu, DType::kFloat32, DType::kFloat8E4M3,
     8192, 16384},
    {"dgelu_dbias_cast_transpose fp32->e5m2 8192x16384", Kind::kDgelu, DType::kFloat32,
     DType::kFloat8E5M2, 8192, 16384},
    {"block_quantize 1x128 bf16->e4m3 8192x8192", Kind::kBlock1x128, DType::kBFloat16,
     DType::kFloat8E4M3, 8192, 8192},
    {"block_quantize 1x128 fp32->e4m3 8192x8192", Kind::kBlock1x128, DType::kFloat32,
     DType::kFloat8E4M3, 8192, 8192},
    {"block_quantize 128x128 bf16->e4m3 8192x8192", Kind::kBlock128x128, DType::kBFloat16,
     DType::kFloat8E4M3, 8192, 8192},
    // LayerNorm fused with the cast and its columnwise copy (norm_forward), LayerNormMLP's
    // [T, H] input.
    {"norm_forward layernorm fp32->e4m3 8192x4096", Kind::kLayerNorm, DType::kFloat32,
     DType::kFloat8E4M3, 8192, 4096},
    {"norm_forward layernorm bf16->e4m3 8192x4096", Kind::kLayerNorm, DType::kBFloat16,
     DType::kFloat8E4M3, 8192, 4096},
    // Current scaling's amax passes in the LayerNormMLP step (the FFN activation and its
    // gradient; an fp32 tensor of the same size).
    {"amax fp32 8192x16384", Kind::kAmax, DType::kFloat32, DType::kFloat8E4M3, 8192, 16384},
    {"gelu_amax bf16 8192x16384", Kind::kGeluAmax, DType::kBFloat16, DType::kFloat8E4M3, 8192,
     16384},
    {"dgelu_amax bf16 8192x16384", Kind::kDgeluAmax, DType::kBFloat16, DType::kFloat8E4M3, 8192,
     16384},
};

bool is_amax(Kind k) { return k == Kind::kAmax || k == Kind::kGeluAmax || k == Kind::kDgeluAmax; }

// Fills t (fp32 or bf16, on GPU 0) with one block of 2^20 standard-normal values repeated: data
// whose largest magnitudes are rare, like activations and gradients. (The amax passes skip the
// activation of elements that cannot raise the maximum, so a constant fill would flatter them.)
void fill_normal(const qmesh::Tensor& t, uint32_t seed) {
  constexpr int64_t kBlock = int64_t{1} << 20;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<uint16_t> bf16(kBlock);
  std::vector<float> fp32(kBlock);
  for (int64_t i = 0; i < kBlock; ++i) {
    fp32[i] = normal(rng);
    bf16[i] = qmesh::float_to_bf16(fp32[i]);
  }
  const size_t elem = qmesh::dtype_size(t.dtype());
  const void* src = t.dtype() == DType::kFloat32 ? static_cast<const void*>(fp32.data())
                                                 : static_cast<const void*>(bf16.data());
  for (int64_t i = 0; i < t.numel(); i += kBlock) {
    const int64_t n = std::min(kBlock, t.numel() - i);
    qmesh::copy_bytes(static_cast<char*>(t.data()) + i * elem, t.device(), src, Device::host(),
                      size_t(n) * elem);
  }
}

struct Row {
  const Case* c;
  double us, gbps, fraction;
};

}  // namespace

int main(int argc, char** argv) try {
  std::string json_path, only;
  const auto usage = [](const char*) {
    std::printf(
        "usage: quant_gpu_bench [--json FILE] [--case NAME]\n"
        "  the fused casts' throughput (cast_transpose bf16/fp32 -> e4m3/e5m2, the GELU-fused\n"
        "  casts, block_quantize with 1x128 and 128x128 blocks, the amax passes of current\n"
        "  scaling: bytes read only) against the D2D copy bandwidth, and the fused\n"
        "  delayed-scaling update of 1000 tensors x history 1024,\n"
        "  on GPU 0\n"
        "  --json: also write the JSON object to FILE\n"
        "  --case: only the casts whose name contains NAME (e.g. 'bf16->e4m3 8192x8192'), one\n"
        "          warm-up and one timed launch each: for profiling with ncu\n");
  };
  qmesh::bench::for_each_option(argc, argv, usage,
                                [&](const std::string& arg, const std::string& value) {
                                  if (arg == "--json")
                                    json_path = value;
                                  else if (arg == "--case")
                                    only = value;
                                  else
                                    QMESH_THROW("unknown option ", arg, " (see --help)");
                                });
  if (qmesh::cuda_device_count() == 0) {
    std::printf("no GPU: quant_gpu_bench needs a CUDA device\n");
    return 0;
  }
  const Device gpu = Device::cuda(0);
  cudaDeviceProp prop{};
  QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));

  std::vector<Row> rows;
  const auto run_cases = [&](double copy_gbps, int iters) {
    for (const Case& c : kCases) {
      if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
      const Shape shape{c.rows, c.cols};
      qmesh::Tensor x(c.in, shape, gpu), pre(c.in, shape, gpu);
      qmesh::Tensor dbias(DType::kFloat32, Shape{c.cols}, gpu);
      qmesh::Tensor gamma(DType::kFloat32, Shape{c.cols}, gpu),
          beta(DType::kFloat32, Shape{c.cols}, gpu);
      qmesh::Tensor mean(DType::kFloat32, Shape{c.rows}, gpu),
          rstd(DType::kFloat32, Shape{c.rows}, gpu);
      QMESH_CHECK_CUDA(cudaMemset(gamma.data(), 0, gamma.nbytes()));
      QMESH_CHECK_CUDA(cudaMemset(beta.data(), 0, beta.nbytes()));
      QMESH_CHECK_CUDA(cudaMemset(x.data(), 0x3F, x.nbytes()));  // bf16 0x3F3F ~ 0.75
      QMESH_CHECK_CUDA(cudaMemset(pre.data(), 0x3E, pre.nbytes()));
      if (is_amax(c.kind)) {
        fill_normal(x, 1);
        fill_normal(pre, 2);
      }
      qmesh::Tensor amax_out(DType::kFloat32, Shape{1}, gpu);
      qmesh::QuantizedTensor q(c.fp8, shape, gpu, true);
      const bool tiles = c.kind == Kind::kBlock128x128;
      const bool blocks = tiles || c.kind == Kind::kBlock1x128;
      qmesh::BlockQuantizedTensor bq;
      if (blocks)
        bq = qmesh::BlockQuantizedTensor(
            c.fp8, shape, tiles ? qmesh::BlockShape::k128x128 : qmesh::BlockShape::k1x128, gpu,
            true);
      const auto cast = [&] {
        switch (c.kind) {
          case Kind::kCastTranspose:
            return qmesh::cast_transpose(x, q.view());
          case Kind::kGelu:
            return qmesh::gelu_cast_transpose(x, q.view());
          case Kind::kDgelu:
            return qmesh::dgelu_dbias_cast_transpose(x, pre, q.view(), dbias);
          case Kind::kBlock1x128:
          case Kind::kBlock128x128:
            return qmesh::block_quantize(x, bq.view(), qmesh::QParams{});
          case Kind::kLayerNorm: {
            qmesh::NormOutputs out;
            out.codes = q.view();
            out.mean = mean;
            out.rstd = rstd;
            return qmesh::norm_forward(x, gamma, beta, {}, out);
          }
          case Kind::kAmax:
            return qmesh::amax(x, amax_out);
          case Kind::kGeluAmax:
            return qmesh::gelu_amax(x, amax_out);
          case Kind::kDgeluAmax:
            return qmesh::dgelu_amax(x, pre, amax_out);
        }
      };
      const double ms = time_ms(cast, iters);
      const double reads = c.kind == Kind::kDgelu || c.kind == Kind::kDgeluAmax ? 2.0 : 1.0;
      const double writes = is_amax(c.kind) ? 0.0 : 2.0;  // codes, both layouts
      // Block scales: one fp32 per 128 elements in each layout (1x128), negligible (128x128).
      const double scales =
          blocks ? double(bq.scale_inv().nbytes() + bq.scale_inv_t().nbytes()) : 0.0;
      const double bytes =
          double(c.rows) * double(c.cols) * (reads * double(qmesh::dtype_size(c.in)) + writes) +
          scales;
      const double gbps = bytes / (ms * 1e6);
      rows.push_back({&c, ms * 1e3, gbps, copy_gbps > 0 ? gbps / copy_gbps : 0.0});
    }
  };
  if (!only.empty()) {  // one launch per case for a profiler, nothing else
    run_cases(0.0, 1);
    for (const Row& row : rows) std::printf("%-50s %10.1f us\n", row.c->name, row.us);
    return 0;
  }

  // Device-to-device copy of 1 GiB: the bandwidth reference (read + write).
  const size_t copy_bytes = size_t{1} << 30;
  qmesh::Buffer src(copy_bytes, gpu), dst(copy_bytes, gpu);
  QMESH_CHECK_CUDA(cudaMemset(src.data(), 1, copy_bytes));
  const double copy_ms = time_ms(
      [&] {
        QMESH_CHECK_CUDA(
            cudaMemcpyAsync(dst.data(), src.data(), copy_bytes, cudaMemcpyDeviceToDevice));
      },
      kIters);
  const double copy_gbps = 2.0 * double(copy_bytes) / (copy_ms * 1e6);
  run_cases(copy_gbps, kIters);

  qmesh::DelayedScaling recipe;  // history 1024
  qmesh::ScalingStates states(
      recipe, std::vector<qmesh::OperandRole>(1000, qmesh::OperandRole::kInput), gpu);
  std::vector<float> amax(1000, 3.0f);
  qmesh::Buffer amax_src(amax.size() * sizeof(float), gpu);
  qmesh::copy_bytes(amax_src.data(), gpu, amax.data(), Device::host(), amax_src.size());
  // Each timed update rolls every history: refill the current amaxes first (a 4 KB copy).
  const auto refill = [&] {
    QMESH_CHECK_CUDA(cudaMemcpyAsync(states.current_amax().data, amax_src.data(), amax_src.size(),
                                     cudaMemcpyDeviceToDevice));
  };
  const double refill_us = time_ms(refill, kIters) * 1e3;
  const double update_us = time_ms(
                               [&] {
                                 refill();
                                 states.update();
                               },
                               kIters) *
                               1e3 -
                           refill_us;

  std::printf("device: %s\n", prop.name);
  std::printf("cudaMemcpy D2D (read+write): %.0f GB/s\n\n", copy_gbps);
  std::printf("%-50s %10s %10s %10s\n", "cast", "time us", "GB/s", "of copy");
  for (const Row& row : rows)
    std::printf("%-50s %10.1f %10.0f %9.1f%%\n", row.c->name, row.us, row.gbps,
                100.0 * row.fraction);
  std::printf("\nfused update, 1000 tensors x history 1024: %.1f us\n\n", update_us);

  char buf[256];
  std::snprintf(buf, sizeof(buf), "\", \"copy_gbps\": %.1f, \"casts\": [", copy_gbps);
  std::string json = std::string("{\"device\": \"") + prop.name + buf;
  for (size_t i = 0; i < rows.size(); ++i) {
    std::snprintf(buf, sizeof(buf),
                  "%s{\"case\": \"%s\", \"rows\": %lld, \"cols\": %lld, \"us\": %.2f, "
                  "\"gbps\": %.1f, \"fraction\": %.4f}",
                  i ? ", " : "", rows[i].c->name, (long long)rows[i].c->rows,
                  (long long)rows[i].c->cols, rows[i].us, rows[i].gbps, rows[i].fraction);
    json += buf;
  }
  std::snprintf(buf, sizeof(buf), "], \"update_1000x1024_us\": %.2f}", update_us);
  json += buf;
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  return 0;
} catch (const qmesh::Error& e) {
  std::fprintf(stderr, "quant_gpu_bench: %s\n", e.message().c_str());
  return 1;
}
