// gemm_block_gpu_bench: which block-scaled FP8 GEMMs (Float8BlockScaling) run on GPU 0 through
// qmesh::gemm, and how fast against BF16 and per-tensor FP8. Every combination of
//   scales       1Dx2D (A 1x128, B 128x128: fprop), 2Dx1D, 1Dx1D (wgrad), 2Dx2D
//   D            fp32, bf16, e4m3 (with amax)
//   epilogue     none, bias (bf16), gelu
//   accumulation fast, split
// in the TN form D [M, N] = A [M, K] · B [N, K]ᵀ with E4M3 operands, at 8192 x 8192 x 8192 and
// at the layer shape 8192 x 16384 x 4096 (M x N x K). Each case says whether it runs, and if
// not, who refused it: qmesh (a documented rule, before cuBLASLt is asked), cuBLASLt's
// heuristic, or cuBLASLt at launch. A case that runs is timed with CUDA events around each
// launch (median of --iters after 3 warm-up launches). Prints a table, then one JSON object.
// Exits 0 with "no GPU" without a device.
//   usage: gemm_block_gpu_bench [--iters N] [--json FILE] (--help)
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "cuda_timing.h"
#include "qmesh/block_quantized_tensor.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/quantized_tensor.h"

namespace {

using qmesh::BlockShape;
using qmesh::DType;
using qmesh::GemmAccumulation;
using qmesh::GemmEpilogue;

struct Shape3 {
  int64_t m, n, k;
};

struct Outcome {
  std::string status;  // "runs", "refused by qmesh", "refused by cuBLASLt", "launch failed"
  std::string reason;
  double median_ms = 0;
};

// Median milliseconds per launch of an initialized GEMM on the legacy default stream, after 3
// warm-up launches.
double median_ms(qmesh::Gemm& op, int iters) {
  for (int i = 0; i < 3; ++i) op.run({});
  return qmesh::bench::median_launch_ms(iters, nullptr, [&] { op.run({}); });
}

// Asks can_implement, then initializes and times the GEMM; every refusal is an outcome.
Outcome try_gemm(const qmesh::GemmArgs& args, int iters) {
  Outcome o;
  const qmesh::Status s = qmesh::Gemm::can_implement(args);
  if (!s.ok()) {
    const bool cublaslt = s.reason().find("cuBLASLt has no algorithm") != std::string::npos;
    o.status = cublaslt ? "refused by cuBLASLt" : "refused by qmesh";
    o.reason = s.reason();
    return o;
  }
  try {
    qmesh::Gemm op;
    op.initialize(args, nullptr, {});
    o.median_ms = median_ms(op, iters);
    o.status = "runs";
  } catch (const qmesh::Error& e) {
    o.status = "launch failed";
    o.reason = e.message();
    (void)cudaDeviceSynchronize();
    (void)cudaGetLastError();
  }
  return o;
}

// JSON string literal of `s` (quotes, backslashes and control characters escaped).
std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// Device operands of one shape: A and B with both block shapes, every code 1.0 (0x38) and
// every scale 1 (BlockQuantizedTensor's start), plus BF16 and per-tensor FP8 baselines.
struct Operands {
  qmesh::BlockQuantizedTensor a1, a2, b1, b2;
  qmesh::Tensor a_bf16, b_bf16, scalars;
  qmesh::QuantizedTensorView a_fp8, b_fp8;
  qmesh::Tensor d_f32, bias, d_scalars;

  Operands(const Shape3& s, qmesh::Device dev)
      : a1(DType::kFloat8E4M3, {s.m, s.k}, BlockShape::k1x128, dev, false),
        a2(DType::kFloat8E4M3, {s.m, s.k}, BlockShape::k128x128, dev, false),
        b1(DType::kFloat8E4M3, {s.n, s.k}, BlockShape::k1x128, dev, false),
        b2(DType::kFloat8E4M3, {s.n, s.k}, BlockShape::k128x128, dev, false),
        a_bf16(DType::kBFloat16, {s.m, s.k}, dev),
        b_bf16(DType::kBFloat16, {s.n, s.k}, dev),
        scalars(DType::kFloat32, {8}, dev),
        d_f32(DType::kFloat32, {s.m, s.n}, dev),  // large enough for every D dtype
        bias(DType::kBFloat16, {s.n}, dev),
        d_scalars(DType::kFloat32, {8}, dev) {
    for (const auto* t : {&a1, &a2, &b1, &b2})
      QMESH_CHECK_CUDA(cudaMemset(t->data().data(), 0x38, t->data().nbytes()));
    QMESH_CHECK_CUDA(cudaMemset(a_bf16.data(), 0, a_bf16.nbytes()));
    QMESH_CHECK_CUDA(cudaMemset(b_bf16.data(), 0, b_bf16.nbytes()));
    QMESH_CHECK_CUDA(cudaMemset(bias.data(), 0, bias.nbytes()));
    const std::vector<float> ones(8, 1.0f);
    QMESH_CHECK_CUDA(cudaMemcpy(scalars.data(), ones.data(), 32, cudaMemcpyHostToDevice));
    QMESH_CHECK_CUDA(cudaMemcpy(d_scalars.data(), ones.data(), 32, cudaMemcpyHostToDevice));
    float* f = scalars.data_as<float>();
    for (auto [q, t] : {std::pair{&a_fp8, &a1}, std::pair{&b_fp8, &b1}}) {
      q->data = t->data().view();
      q->scale = f;
      q->scale_inv = f + 4;  // 16-byte aligned, as cuBLASLt needs
      q->amax = f + 2;
    }
  }
  qmesh::TensorView d(DType t, const Shape3& s) const {
    return qmesh::TensorView(d_f32.data(), t, qmesh::Shape{s.m, s.n}, d_f32.device());
  }
};

struct ScaleCombo {
  const char* name;
  BlockShape a, b;
};

}  // namespace

int main(int argc, char** argv) try {
  int iters = 10;
  std::string json_path;
  const auto usage = [](const char*) {
    std::printf(
        "usage: gemm_block_gpu_bench [--iters N] [--json FILE]\n"
        "  which block-scaled FP8 GEMMs run on GPU 0 through qmesh::gemm (scales 1Dx2D, 2Dx1D,\n"
        "  1Dx1D, 2Dx2D; D fp32, bf16, e4m3; epilogue none, bias, gelu; fast and split\n"
        "  accumulation) at 8192^3 and 8192 x 16384 x 4096, timed against BF16 and per-tensor\n"
        "  FP8 (CUDA events, median)\n"
        "  --iters: timed launches per case (default 10)\n"
        "  --json:  also write the JSON object to FILE\n");
  };
  qmesh::bench::iters_and_json_options(argc, argv, usage, iters, json_path);
  if (qmesh::cuda_device_count() == 0) {
    std::printf("no GPU: gemm_block_gpu_bench needs a CUDA device; nothing was probed\n");
    return 0;
  }
  const qmesh::Device dev = qmesh::Device::cuda(0);
  cudaDeviceProp prop{};
  QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("%s (sm_%d%d): block-scaled E4M3 GEMMs through qmesh::gemm\n\n", prop.name,
              prop.major, prop.minor);
  std::printf("%-19s %-6s %-5s %-5s %-5s %-21s %9s %8s %7s  %s\n", "shape", "scales", "D", "epi",
              "acc", "outcome", "median ms", "TFLOP/s", "vs bf16", "reason");
  const ScaleCombo combos[] = {{"1Dx2D", BlockShape::k1x128, BlockShape::k128x128},
                               {"2Dx1D", BlockShape::k128x128, BlockShape::k1x128},
                               {"1Dx1D", BlockShape::k1x128, BlockShape::k1x128},
                               {"2Dx2D", BlockShape::k128x128, BlockShape::k128x128}};
  const std::pair<const char*, DType> d_types[] = {
      {"fp32", DType::kFloat32}, {"bf16", DType::kBFloat16}, {"e4m3", DType::kFloat8E4M3}};
  const std::pair<const char*, GemmEpilogue> epilogues[] = {
      {"none", GemmEpilogue::kNone}, {"bias", GemmEpilogue::kBias}, {"gelu", GemmEpilogue::kGelu}};
  const std::pair<const char*, GemmAccumulation> accs[] = {{"fast", GemmAccumulation::kFast},
                                                           {"split", GemmAccumulation::kSplit}};

  std::string json = "{\"device\": " + json_string(prop.name) + ", \"cases\": [";
  bool first = true;
  for (const Shape3 s : {Shape3{8192, 8192, 8192}, Shape3{8192, 16384, 4096}}) {
    const std::string shape =
        std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    Operands ops(s, dev);
    auto report = [&](const std::string& scales, const char* d, const char* epi, const char* acc,
                      const Outcome& o, double bf16_ms) {
      const bool runs = o.status == "runs";
      const double tflops = runs ? flops / (o.median_ms * 1e-3) / 1e12 : 0.0;
      const double speedup = runs && bf16_ms > 0 ? bf16_ms / o.median_ms : 0.0;
      std::printf("%-19s %-6s %-5s %-5s %-5s %-21s %9.3f %8.1f %7.2f  %s\n", shape.c_str(),
                  scales.c_str(), d, epi, acc, o.status.c_str(), o.median_ms, tflops, speedup,
                  o.reason.substr(0, 160).c_str());
      json += std::string(first ? "" : ", ") + "{\"shape\": " + json_string(shape) +
              ", \"scales\": " + json_string(scales) + ", \"d\": " + json_string(d) +
              ", \"epilogue\": " + json_string(epi) + ", \"accumulation\": " + json_string(acc) +
              ", \"outcome\": " + json_string(o.status) +
              ", \"median_ms\": " + std::to_string(o.median_ms) +
              ", \"tflops\": " + std::to_string(tflops) +
              ", \"speedup_vs_bf16\": " + std::to_string(speedup) +
              ", \"reason\": " + json_string(o.reason) + "}";
      first = false;
      std::fflush(stdout);
    };

    // Baselines: BF16 and per-tensor FP8 (bf16 D, no epilogue).
    qmesh::GemmArgs base;
    base.a = qmesh::GemmOperand::plain(ops.a_bf16.view());
    base.b = qmesh::GemmOperand::plain(ops.b_bf16.view());
    base.d = ops.d(DType::kBFloat16, s);
    const Outcome bf16 = try_gemm(base, iters);
    const double bf16_ms = bf16.status == "runs" ? bf16.median_ms : 0.0;
    report("bf16", "bf16", "none", "-", bf16, bf16_ms);
    for (const auto& [acc_name, acc] : accs) {
      qmesh::GemmArgs fp8 = base;
      fp8.a = qmesh::GemmOperand::fp8(ops.a_fp8);
      fp8.b = qmesh::GemmOperand::fp8(ops.b_fp8);
      fp8.accumulation = acc;
      report("tensor", "bf16", "none", acc_name, try_gemm(fp8, iters), bf16_ms);
    }

    for (const ScaleCombo& combo : combos)
      for (const auto& [d_name, d_type] : d_types)
        for (const auto& [epi_name, epi] : epilogues)
          for (const auto& [acc_name, acc] : accs) {
            qmesh::GemmArgs g;
            g.a = qmesh::GemmOperand::fp8_block(
                (combo.a == BlockShape::k1x128 ? ops.a1 : ops.a2).view());
            g.b = qmesh::GemmOperand::fp8_block(
                (combo.b == BlockShape::k1x128 ? ops.b1 : ops.b2).view());
            g.d = ops.d(d_type, s);
            if (qmesh::is_fp8(d_type)) {
              g.d_scale = ops.d_scalars.data_as<float>();
              g.d_amax = ops.d_scalars.data_as<float>() + 4;
            }
            g.epilogue = epi;
            if (epi == GemmEpilogue::kBias) g.bias = ops.bias.view();
            g.accumulation = acc;
            report(combo.name, d_name, epi_name, acc_name, try_gemm(g, iters), bf16_ms);
          }
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  return 0;
} catch (const qmesh::Error& e) {
  std::fprintf(stderr, "gemm_block_gpu_bench: %s\n", e.message().c_str());
  return 1;
}
