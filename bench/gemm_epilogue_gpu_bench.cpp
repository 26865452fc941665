// gemm_epilogue_gpu_bench: which FP8 GEMM epilogues, output types and scale modes cuBLASLt
// offers on GPU 0, and how fast each runs, at the first GEMM of the LayerNormMLP step
// (tokens 8192 x ffn 16384 x hidden 4096 by default: D [tokens, ffn] = X [tokens, hidden] ·
// W [ffn, hidden]ᵀ, E4M3 operands, fp32 accumulation). Every case asks cuBLASLt's heuristic for
// algorithms; an offered case is run with the first one and timed with CUDA events (median of
// --iters launches after 3 warm-up launches); a refused case records cuBLASLt's status. The
// results decide which epilogues the layers use (docs/design/gemm.md "What cuBLASLt offers").
// Talks to cuBLASLt directly (not through qmesh::gemm), so that it probes what qmesh does not
// ask for yet. Prints a table, then one JSON object. Exits 0 with "no GPU" without a device.
//   usage: gemm_epilogue_gpu_bench [--m M] [--n N] [--k K] [--iters N] [--json FILE]
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "bench_util.h"
#include "cuda_timing.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/error.h"

namespace {

using Scale = cublasLtMatmulMatrixScale_t;

struct Case {
  const char* name;
  cudaDataType_t d_type;
  cublasLtEpilogue_t epilogue;
  cudaDataType_t aux_type;  // GELU_AUX: the pre-activation's type
  Scale a_scale, b_scale;   // A: the weight W, B: the activation X (cuBLASLt's column-major view)
};

constexpr Scale kScalar = CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
constexpr Scale kVec128 = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
constexpr Scale kBlk128 = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;

const Case kCases[] = {
    {"bf16 D", CUDA_R_16BF, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF, kScalar, kScalar},
    {"bf16 D + bias", CUDA_R_16BF, CUBLASLT_EPILOGUE_BIAS, CUDA_R_16BF, kScalar, kScalar},
    {"bf16 D + bias + GELU, bf16 aux", CUDA_R_16BF, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_16BF,
     kScalar, kScalar},
    {"fp32 D", CUDA_R_32F, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_32F, kScalar, kScalar},
    {"fp32 D + bias + GELU, fp32 aux", CUDA_R_32F, CUBLASLT_EPILOGUE_GELU_AUX_BIAS, CUDA_R_32F,
     kScalar, kScalar},
    {"e4m3 D + amax", CUDA_R_8F_E4M3, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF, kScalar, kScalar},
    {"e4m3 D + amax + bias", CUDA_R_8F_E4M3, CUBLASLT_EPILOGUE_BIAS, CUDA_R_16BF, kScalar, kScalar},
    {"e4m3 D + amax + bias + GELU", CUDA_R_8F_E4M3, CUBLASLT_EPILOGUE_GELU_BIAS, CUDA_R_16BF,
     kScalar, kScalar},
    {"e4m3 D + amax + bias + GELU, bf16 aux", CUDA_R_8F_E4M3, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
     CUDA_R_16BF, kScalar, kScalar},
    {"e4m3 D + amax + bias + GELU, e4m3 aux", CUDA_R_8F_E4M3, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
     CUDA_R_8F_E4M3, kScalar, kScalar},
    {"bf16 D, W 1x128 / X 1x128 scales", CUDA_R_16BF, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF,
     kVec128, kVec128},
    {"bf16 D, W 128x128 / X 1x128 scales", CUDA_R_16BF, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF,
     kBlk128, kVec128},
    {"bf16 D, W 1x128 / X 128x128 scales", CUDA_R_16BF, CUBLASLT_EPILOGUE_DEFAULT, CUDA_R_16BF,
     kVec128, kBlk128},
    {"bf16 D + bias, W 128x128 / X 1x128 scales", CUDA_R_16BF, CUBLASLT_EPILOGUE_BIAS, CUDA_R_16BF,
     kBlk128, kVec128},
};

size_t type_bytes(cudaDataType_t t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16BF:
      return 2;
    default:
      return 1;
  }
}

struct Result {
  bool offered = false;
  std::string status;  // cuBLASLt's status name where refused
  int algos = 0;
  double median_ms = 0;
};

std::string status_name(cublasStatus_t s) { return cublasLtGetStatusName(s); }

// Device memory for the largest case, every byte of the scales 1.0f, the rest zero.
struct Buffers {
  void *a, *b, *c, *d, *aux, *bias, *ones, *amax, *workspace;
  size_t workspace_bytes = size_t{32} << 20;
  Buffers(int64_t m, int64_t n, int64_t k) {
    const int64_t scales = (k / 128 + 1) * std::max(m, n);
    QMESH_CHECK_CUDA(cudaMalloc(&a, size_t(m * k)));
    QMESH_CHECK_CUDA(cudaMalloc(&b, size_t(n * k)));
    QMESH_CHECK_CUDA(cudaMalloc(&c, size_t(m * n) * 4));  // C apart from D: other types
    QMESH_CHECK_CUDA(cudaMalloc(&d, size_t(m * n) * 4));
    QMESH_CHECK_CUDA(cudaMalloc(&aux, size_t(m * n) * 4));
    QMESH_CHECK_CUDA(cudaMalloc(&bias, size_t(m) * 4));
    QMESH_CHECK_CUDA(cudaMalloc(&ones, size_t(scales) * 4));
    QMESH_CHECK_CUDA(cudaMalloc(&amax, 64));
    QMESH_CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
    QMESH_CHECK_CUDA(cudaMemset(a, 0x38, size_t(m * k)));  // 1.0 in E4M3
    QMESH_CHECK_CUDA(cudaMemset(b, 0x38, size_t(n * k)));
    QMESH_CHECK_CUDA(cudaMemset(bias, 0, size_t(m) * 4));
    QMESH_CHECK_CUDA(cudaMemset(amax, 0, 64));
    const std::vector<float> host(size_t(scales), 1.0f);
    QMESH_CHECK_CUDA(cudaMemcpy(ones, host.data(), host.size() * 4, cudaMemcpyHostToDevice));
  }
  ~Buffers() {
    for (void* p : {a, b, c, d, aux, bias, ones, amax, workspace}) cudaFree(p);
  }
};

// cuBLASLt's column-major view of D [tokens, ffn] = X · Wᵀ: D_cm [m = ffn, n = tokens] =
// op(A) · B with A = W stored [k, m] (transposed), B = X stored [k, n].
Result probe(cublasLtHandle_t lt, const Case& c, int64_t m, int64_t n, int64_t k, int iters,
             Buffers& buf, cudaStream_t stream) {
  Result r;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr, ld = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  const bool fp8_d = c.d_type == CUDA_R_8F_E4M3;
  const cudaDataType_t c_type = fp8_d ? CUDA_R_16BF : c.d_type;
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const auto& value) {
    return cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value));
  };
  const cublasOperation_t t = CUBLAS_OP_T, nt = CUBLAS_OP_N;
  const void* ones = buf.ones;
  const void* bias = buf.bias;
  void* aux = buf.aux;
  void* amax = buf.amax;
  void* aux_amax = static_cast<char*>(buf.amax) + 16;  // 16-byte aligned, as cuBLASLt needs
  const int64_t aux_ld = m;
  const cudaDataType_t bias_type = c.d_type == CUDA_R_32F ? CUDA_R_32F : CUDA_R_16BF;
  const bool with_bias = c.epilogue != CUBLASLT_EPILOGUE_DEFAULT;
  const bool with_aux = c.epilogue == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
  // The first failing call's status is kept; the calls after it fail harmlessly or no-op.
  cublasStatus_t s = cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  auto then = [&](cublasStatus_t next) {
    if (s == CUBLAS_STATUS_SUCCESS) s = next;
  };
  if (s == CUBLAS_STATUS_SUCCESS) {
    then(set(CUBLASLT_MATMUL_DESC_TRANSA, t));
    then(set(CUBLASLT_MATMUL_DESC_TRANSB, nt));
    then(set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, uint32_t(c.a_scale)));
    then(set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, uint32_t(c.b_scale)));
    then(set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, ones));
    then(set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, ones));
    if (fp8_d) {
      then(set(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, ones));
      then(set(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, amax));
    }
    then(set(CUBLASLT_MATMUL_DESC_EPILOGUE, c.epilogue));
    if (with_bias) {
      then(set(CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias));
      then(set(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(bias_type)));
    }
    if (with_aux) {
      then(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, aux));
      then(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, aux_ld));
      then(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, int32_t(c.aux_type)));
      if (c.aux_type == CUDA_R_8F_E4M3) {
        then(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_SCALE_POINTER, ones));
        then(set(CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_AMAX_POINTER, aux_amax));
      }
    }
  }
  then(cublasLtMatrixLayoutCreate(&la, CUDA_R_8F_E4M3, k, m, k));
  then(cublasLtMatrixLayoutCreate(&lb, CUDA_R_8F_E4M3, k, n, k));
  then(cublasLtMatrixLayoutCreate(&lc, c_type, m, n, m));
  then(cublasLtMatrixLayoutCreate(&ld, c.d_type, m, n, m));
  then(cublasLtMatmulPreferenceCreate(&pref));
  if (pref)
    then(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                              &buf.workspace_bytes, sizeof(buf.workspace_bytes)));
  cublasLtMatmulHeuristicResult_t heur[8] = {};
  int found = 0;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 8, heur, &found);
  if (s == CUBLAS_STATUS_SUCCESS && found == 0) s = CUBLAS_STATUS_NOT_SUPPORTED;
  r.algos = found;
  const float alpha = 1.0f, beta = 0.0f;
  auto launch = [&] {
    return cublasLtMatmul(lt, desc, &alpha, buf.a, la, buf.b, lb, &beta, buf.c, lc, buf.d, ld,
                          &heur[0].algo, buf.workspace, buf.workspace_bytes, stream);
  };
  for (int i = 0; i < 3 && s == CUBLAS_STATUS_SUCCESS; ++i) s = launch();
  if (s == CUBLAS_STATUS_SUCCESS && cudaStreamSynchronize(stream) != cudaSuccess)
    s = CUBLAS_STATUS_EXECUTION_FAILED;
  if (s == CUBLAS_STATUS_SUCCESS)
    r.median_ms = qmesh::bench::median_launch_ms(iters, stream, [&] {
      if (s == CUBLAS_STATUS_SUCCESS) s = launch();
    });
  r.offered = s == CUBLAS_STATUS_SUCCESS;
  if (!r.offered) r.status = status_name(s);
  (void)cudaGetLastError();  // a refused launch leaves no sticky error, but be sure
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  for (auto* l : {la, lb, lc, ld})
    if (l) cublasLtMatrixLayoutDestroy(l);
  if (desc) cublasLtMatmulDescDestroy(desc);
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  int64_t tokens = 8192, ffn = 16384, hidden = 4096;
  int iters = 20;
  std::string json_path;
  const auto usage = [](const char*) {
    std::printf(
        "usage: gemm_epilogue_gpu_bench [--m M] [--n N] [--k K] [--iters N] [--json FILE]\n"
        "  which FP8 (E4M3) GEMM epilogues, output types and scale modes cuBLASLt offers on\n"
        "  GPU 0, each timed: D [M, N] = X [M, K] . W [N, K]^T\n"
        "  --m: tokens (default 8192), --n: output features (16384), --k: input features (4096)\n"
        "  --iters: timed launches per case (default 20; median reported)\n"
        "  --json:  also write the JSON object to FILE\n");
  };
  qmesh::bench::for_each_option(argc, argv, usage,
                                [&](const std::string& arg, const std::string& value) {
                                  if (arg == "--m")
                                    tokens = qmesh::bench::int_option(arg, value, 16);
                                  else if (arg == "--n")
                                    ffn = qmesh::bench::int_option(arg, value, 16);
                                  else if (arg == "--k")
                                    hidden = qmesh::bench::int_option(arg, value, 128);
                                  else if (arg == "--iters")
                                    iters = qmesh::bench::positive(arg, value);
                                  else if (arg == "--json")
                                    json_path = value;
                                  else
                                    QMESH_THROW("unknown option ", arg, " (see --help)");
                                });
  QMESH_CHECK(tokens % 16 == 0 && ffn % 16 == 0 && hidden % 128 == 0,
              "--m and --n must be multiples of 16 and --k of 128 (FP8 GEMMs, 128-element "
              "scale blocks)");
  if (qmesh::cuda_device_count() == 0) {
    std::printf("no GPU: gemm_epilogue_gpu_bench needs a CUDA device; nothing was probed\n");
    return 0;
  }
  cudaDeviceProp prop{};
  QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  cublasLtHandle_t lt = nullptr;
  if (cublasLtCreate(&lt) != CUBLAS_STATUS_SUCCESS) QMESH_THROW("cublasLtCreate failed");
  cudaStream_t stream = nullptr;
  QMESH_CHECK_CUDA(cudaStreamCreate(&stream));
  const double flops = 2.0 * double(tokens) * double(ffn) * double(hidden);
  std::printf("%s (sm_%d%d), cuBLASLt %zu: E4M3 GEMM %lld x %lld x %lld\n\n", prop.name, prop.major,
              prop.minor, cublasLtGetVersion(), (long long)tokens, (long long)ffn,
              (long long)hidden);
  std::printf("%-44s %8s %10s %9s  %s\n", "case", "offered", "median ms", "TFLOP/s", "status");
  std::string json = std::string("{\"device\": \"") + prop.name +
                     "\", \"cublaslt_version\": " + std::to_string(cublasLtGetVersion()) +
                     ", \"m\": " + std::to_string(tokens) + ", \"n\": " + std::to_string(ffn) +
                     ", \"k\": " + std::to_string(hidden) + ", \"cases\": [";
  {
    Buffers buf(ffn, tokens, hidden);
    bool first = true;
    for (const Case& c : kCases) {
      const Result r = probe(lt, c, ffn, tokens, hidden, iters, buf, stream);
      const double tflops = r.offered ? flops / (r.median_ms * 1e-3) / 1e12 : 0.0;
      std::printf("%-44s %8s %10.3f %9.1f  %s\n", c.name, r.offered ? "yes" : "no", r.median_ms,
                  tflops, r.status.c_str());
      char entry[512];
      std::snprintf(entry, sizeof(entry),
                    "%s{\"case\": \"%s\", \"offered\": %s, \"algos\": %d, \"median_ms\": %.4f, "
                    "\"tflops\": %.1f, \"status\": \"%s\"}",
                    first ? "" : ", ", c.name, r.offered ? "true" : "false", r.algos, r.median_ms,
                    tflops, r.status.c_str());
      json += entry;
      first = false;
    }
  }
  json += "]}";
  std::printf("%s\n", json.c_str());
  if (!json_path.empty()) std::ofstream(json_path) << json << "\n";
  cudaStreamDestroy(stream);
  cublasLtDestroy(lt);
  return 0;
} catch (const qmesh::Error& e) {
  std::fprintf(stderr, "gemm_epilogue_gpu_bench: %s\n", e.message().c_str());
  return 1;
}
