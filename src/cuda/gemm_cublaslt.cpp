#include "cuda/gemm_cublaslt.h"

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "core/stream_cleanup.h"
#include "cuda/cublaslt_check.h"
#include "cuda/device_scalar.h"
#include "cuda/gemm_algo_cache.h"
#include "cuda/stream_scratch.h"
#include "ops/gemm_algo_key.h"
#include "qmesh/cuda_check.h"
#include "qmesh/device.h"
#include "qmesh/logging.h"

namespace qmesh::detail {

namespace {

// Candidates asked of the heuristic; autotuning times each of them (after kWarmUpRuns
// launches, so that clocks and caches have settled) and keeps the candidate the heuristic
// ranks higher unless a lower-ranked one is faster by more than kTuneMargin: with 3 timed launches
// and no margin it chose slower algorithms for 4 of 6 FP8 shapes on an H100
// (docs/benchmarks/gpu-h100.md).
constexpr int kHeuristicCandidates = 8;
constexpr int kWarmUpRuns = 3;
constexpr int kTimedRuns = 10;
constexpr float kTuneMargin = 0.03f;

// cuBLASLt 13.1 refuses to launch an FP8 GEMM whose scale pointers are not 16-byte aligned
// (CUBLAS_STATUS_NOT_SUPPORTED from cublasLtMatmul, although its heuristic offered
// algorithms; seen on an H100, docs/design/gemm.md). Such a scalar is staged: copied into
// 16-byte-aligned stream-ordered scratch before each launch, and an amax copied back after.
// Floats between two staged scalars, so that each starts 16 bytes after the previous one.
constexpr size_t kStagedStride = kCublasLtScalarAlignment / sizeof(float);

bool misaligned_scalar(const float* p) {
  return p != nullptr && reinterpret_cast<uintptr_t>(p) % kCublasLtScalarAlignment != 0;
}

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::kFloat32:
      return CUDA_R_32F;
    case DType::kFloat16:
      return CUDA_R_16F;
    case DType::kBFloat16:
      return CUDA_R_16BF;
    case DType::kFloat8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::kFloat8E5M2:
      return CUDA_R_8F_E5M2;
    case DType::kFloat4E2M1x2:  // cuBLASLt counts the elements, two per byte
      return CUDA_R_4F_E2M1;
    default:
      QMESH_THROW("dtype ", dtype_name(t), " has no cuBLASLt GEMM type");
  }
}

// cuBLASLt's scale mode of an operand (qmesh's 1x128 / 128x128 block layouts are cuBLASLt's:
// see qmesh/block_quantized_tensor.h; MXFP8 and NVFP4 scales are swizzled first,
// ops/scale_swizzle.h).
int32_t cublaslt_scale_mode(GemmScaling s) {
  switch (s) {
    case GemmScaling::kTensor:
      return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case GemmScaling::kBlock1x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case GemmScaling::kBlock128x128:
      return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
    case GemmScaling::kVec32Ue8m0:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0;
    case GemmScaling::kVec16Ue4m3:
      return CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
  }
  QMESH_THROW("invalid GemmScaling ", int(s));
}

cublasLtEpilogue_t cublaslt_epilogue(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return CUBLASLT_EPILOGUE_DEFAULT;
    case GemmEpilogue::kBias:
      return CUBLASLT_EPILOGUE_BIAS;
    case GemmEpilogue::kGelu:
      return CUBLASLT_EPILOGUE_GELU;
    case GemmEpilogue::kBiasGeluAux:
      return CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
    case GemmEpilogue::kDGelu:
      return CUBLASLT_EPILOGUE_DGELU;
    // B' is our A (see ColumnMajorGemm): BGRADB sums op(A) over K, one value per row of D.
    case GemmEpilogue::kBiasGrad:
      return CUBLASLT_EPILOGUE_BGRADB;
  }
  QMESH_THROW("invalid GemmEpilogue ", int(e));
}

// Handles (one per device) and workspaces (one per device and stream), created on first use.
// A workspace is freed when its stream's OwnedStream is destroyed (core/stream_cleanup.h);
// the others, and the handles, are kept for the life of the process: freeing them at static
// destruction would race the CUDA runtime's own teardown.
struct Resources {
  std::mutex mutex;
  std::map<int, cublasLtHandle_t> handles;
  std::map<std::pair<int, uintptr_t>, void*> workspaces;
  std::map<int, std::string> device_names;
};

Resources& resources() {
  static Resources* r = new Resources;
  return *r;
}

cublasLtHandle_t handle_for(int device) {
  Resources& r = resources();
  std::lock_guard lock(r.mutex);
  auto it = r.handles.find(device);
  if (it == r.handles.end()) {
    cublasLtHandle_t handle = nullptr;
    QMESH_CHECK_CUBLAS(cublasLtCreate(&handle));
    it = r.handles.emplace(device, handle).first;
  }
  return it->second;
}

// Waits for `stream`, then frees its workspace on `device` (run by at_stream_destroy).
void release_workspace(int device, cudaStream_t stream) {
  Resources& r = resources();
  void* ws = nullptr;
  {
    std::lock_guard lock(r.mutex);
    const auto it = r.workspaces.find({device, reinterpret_cast<uintptr_t>(stream)});
    if (it == r.workspaces.end()) return;
    ws = it->second;
    r.workspaces.erase(it);
  }
  const DeviceGuard guard(device);
  QMESH_CHECK_CUDA(cudaStreamSynchronize(stream));
  QMESH_CHECK_CUDA(cudaFree(ws));
}

void* workspace_for(int device, cudaStream_t stream) {
  Resources& r = resources();
  std::lock_guard lock(r.mutex);
  const auto key = std::make_pair(device, reinterpret_cast<uintptr_t>(stream));
  auto it = r.workspaces.find(key);
  if (it == r.workspaces.end()) {
    void* ws = nullptr;
    QMESH_CHECK_CUDA(cudaMalloc(&ws, kCublasLtWorkspaceBytes));
    it = r.workspaces.emplace(key, ws).first;
    if (stream != nullptr)
      detail::at_stream_destroy(stream, [device, stream] { release_workspace(device, stream); });
  }
  return it->second;
}

const std::string& device_name(int device) {
  Resources& r = resources();
  std::lock_guard lock(r.mutex);
  auto it = r.device_names.find(device);
  if (it == r.device_names.end()) {
    cudaDeviceProp prop{};
    QMESH_CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
    it = r.device_names.emplace(device, prop.name).first;
  }
  return it->second;
}

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  QMESH_CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

// A column-major layout; with batch > 1 a strided batch of `batch` matrices, `stride`
// elements apart.
cublasLtMatrixLayout_t make_layout(DType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                   int64_t stride) {
  cublasLtMatrixLayout_t layout = nullptr;
  QMESH_CHECK_CUBLAS(
      cublasLtMatrixLayoutCreate(&layout, cuda_type(t), uint64_t(rows), uint64_t(cols), ld));
  if (batch > 1) {
    const auto count = int32_t(batch);
    QMESH_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                        &count, sizeof(count)));
    QMESH_CHECK_CUBLAS(cublasLtMatrixLayoutSetAttribute(
        layout, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return layout;
}

// C: D itself (read only with beta = 1), or none for an FP8 D (beta = 0 there).
const void* c_pointer(const CanonicalGemm& c) { return is_fp8(c.d_dtype) ? nullptr : c.d; }

// Everything that selects an algorithm, as the autotune cache key (ops/gemm_algo_key.h).
std::string problem_key(const CanonicalGemm& c) {
  return gemm_algo_key(c, device_name(c.device.index), cublasLtGetVersion());
}

// C's type: D's, except that an FP8 D (beta = 0, C not passed) takes the bias's type, or
// bf16 without a bias (cuBLASLt's FP8 rule).
DType c_dtype(const CanonicalGemm& c) {
  if (!is_fp8(c.d_dtype)) return c.d_dtype;
  return c.bias ? c.bias_dtype : DType::kBFloat16;
}

// A start/stop event pair for timing, destroyed with its scope.
struct TimingEvents {
  cudaEvent_t start = nullptr, stop = nullptr;
  TimingEvents() {
    QMESH_CHECK_CUDA(cudaEventCreate(&start));
    const cudaError_t status = cudaEventCreate(&stop);
    if (status != cudaSuccess) (void)cudaEventDestroy(start);
    QMESH_CHECK_CUDA(status);
  }
  ~TimingEvents() {
    (void)cudaEventDestroy(start);
    (void)cudaEventDestroy(stop);
  }
  TimingEvents(const TimingEvents&) = delete;
  TimingEvents& operator=(const TimingEvents&) = delete;
};

}  // namespace

struct CublasLtGemm::Impl {
  CanonicalGemm c;
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, c_layout = nullptr,
                         d_layout = nullptr;
  cublasLtMatmulAlgo_t algo{};
  float alpha = 1.0f;  // read by cuBLASLt from host memory at each launch, unless
  float beta = 0.0f;   // c.device_alpha_beta holds them on the device

  // A scalar pointer attribute that is staged at each launch (see kStagedStride).
  struct StagedScalar {
    cublasLtMatmulDescAttributes_t attr;
    float* source;
    bool is_output;  // the amax: written by the GEMM, copied back to `source`
  };
  std::vector<StagedScalar> staged;
  // Staging points the descriptor at per-launch scratch: one launch at a time.
  std::mutex staging_mutex;

  ~Impl() {
    for (cublasLtMatrixLayout_t l : {a_layout, b_layout, c_layout, d_layout})
      if (l) (void)cublasLtMatrixLayoutDestroy(l);
    if (desc) (void)cublasLtMatmulDescDestroy(desc);
  }

  void describe() {
    const ColumnMajorGemm& cm = c.cm;
    QMESH_CHECK_CUBLAS(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSA, int32_t(cm.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N));
    set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSB, int32_t(cm.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N));
    if (c.fp8_inputs())
      set_attr(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM,
               int8_t(c.accumulation == GemmAccumulation::kFast ? 1 : 0));
    if (c.device_alpha_beta)
      set_attr(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, int32_t(CUBLASLT_POINTER_MODE_DEVICE));
    if (c.block_scaled()) {  // A' is our B and B' our A: their scale modes swap with them
      set_attr(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, cublaslt_scale_mode(c.b.scaling));
      set_attr(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, cublaslt_scale_mode(c.a.scaling));
    }
    set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, uint32_t(cublaslt_epilogue(c.epilogue)));
    // Bias and aux types default to D's; FP8 and FP4 GEMMs name theirs (canonicalize checked
    // that plain GEMMs use D's).
    if (c.bias && c.quantized_inputs())
      set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(cuda_type(c.bias_dtype)));
    if (c.aux) {
      set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, int64_t(cm.ldd));
      if (c.quantized_inputs())
        set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                 int32_t(cuda_type(c.aux_dtype)));
    }
    set_pointers();
    // Column-major layouts of the stored matrices (see ColumnMajorGemm).
    a_layout = cm.trans_a ? make_layout(c.b.dtype, cm.k, cm.m, cm.lda, cm.batch, cm.stride_a)
                          : make_layout(c.b.dtype, cm.m, cm.k, cm.lda, cm.batch, cm.stride_a);
    b_layout = cm.trans_b ? make_layout(c.a.dtype, cm.n, cm.k, cm.ldb, cm.batch, cm.stride_b)
                          : make_layout(c.a.dtype, cm.k, cm.n, cm.ldb, cm.batch, cm.stride_b);
    c_layout = make_layout(c_dtype(c), cm.m, cm.n, cm.ldd, cm.batch, cm.stride_d);
    d_layout = make_layout(c.d_dtype, cm.m, cm.n, cm.ldd, cm.batch, cm.stride_d);
  }

  // The descriptor's pointer attributes (scalars, bias, aux) from `c`. A, B, C and D are
  // arguments of each launch.
  void set_pointers() {
    staged.clear();
    if (c.quantized_inputs()) {
      // A' is our B and B' our A. Block scale tensors are 16-byte aligned (canonicalize
      // checks it), so only per-tensor scalars are ever staged.
      set_scalar(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, const_cast<float*>(c.b.scale_inv));
      set_scalar(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, const_cast<float*>(c.a.scale_inv));
    }
    if (is_fp8(c.d_dtype)) {
      set_scalar(CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, c.d_scale);
      if (c.d_amax) set_scalar(CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, c.d_amax, true);
    }
    if (c.bias) set_attr(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, c.bias);
    if (c.aux) set_attr(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, c.aux);
  }

  // The plan re-pointed at the tensors of `next`, a GEMM of the same problem (gemm_problem):
  // a few host-side descriptor writes, no cuBLASLt query.
  void point_at(const CanonicalGemm& next) {
    c = next;
    alpha = next.alpha;
    set_pointers();
  }

  // Points `attr` at the scalar `p`, noting it for staging when it is not aligned.
  void set_scalar(cublasLtMatmulDescAttributes_t attr, float* p, bool is_output = false) {
    set_attr(desc, attr, static_cast<const float*>(p));
    if (misaligned_scalar(p)) staged.push_back({attr, p, is_output});
  }

  std::vector<cublasLtMatmulHeuristicResult_t> candidates() {
    cublasLtMatmulPreference_t raw = nullptr;
    QMESH_CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&raw));
    const std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>,
                          decltype(&cublasLtMatmulPreferenceDestroy)>
        pref(raw, &cublasLtMatmulPreferenceDestroy);
    const uint64_t ws = kCublasLtWorkspaceBytes;
    QMESH_CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(
        raw, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // cuBLASLt's heuristic assumes 256-byte alignment unless told otherwise, and a kernel
    // chosen for 256 fails on a less aligned view (a row chunk of a larger tensor, as the
    // collective GEMMs pass).
    const std::array<uint32_t, 4> align = gemm_operand_alignments(c);
    const cublasLtMatmulPreferenceAttributes_t align_attrs[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (size_t i = 0; i < align.size(); ++i)
      QMESH_CHECK_CUBLAS(
          cublasLtMatmulPreferenceSetAttribute(raw, align_attrs[i], &align[i], sizeof(align[i])));
    std::vector<cublasLtMatmulHeuristicResult_t> results(kHeuristicCandidates);
    int returned = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(handle, desc, a_layout, b_layout, c_layout, d_layout, raw,
                                       kHeuristicCandidates, results.data(), &returned);
    QMESH_CHECK_KIND(ErrorKind::kUnsupported, status == CUBLAS_STATUS_SUCCESS && returned > 0,
                     "cuBLASLt has no algorithm for this GEMM (", problem_key(c), "; status ",
                     cublasLtGetStatusName(status),
                     "): the dtype/epilogue combination is not supported on ", c.device.str(),
                     " (FP8 bias and aux are usually bf16, or fp16 with an fp16 D)");
    results.resize(size_t(returned));
    return results;
  }

  cublasStatus_t matmul(const cublasLtMatmulAlgo_t& a, cudaStream_t stream, void* workspace) {
    // A' = our B, B' = our A.
    const float* alpha_p = c.device_alpha_beta ? c.device_alpha_beta : &alpha;
    const float* beta_p = c.device_alpha_beta ? c.device_alpha_beta + 1 : &beta;
    return cublasLtMatmul(handle, desc, alpha_p, c.b.data, a_layout, c.a.data, b_layout, beta_p,
                          c_pointer(c), c_layout, c.d, d_layout, &a, workspace,
                          kCublasLtWorkspaceBytes, stream);
  }

  // One launch of algorithm `a`, its misaligned scalars staged around it.
  cublasStatus_t enqueue(const cublasLtMatmulAlgo_t& a, cudaStream_t stream, void* workspace) {
    if (staged.empty()) return matmul(a, stream, workspace);
    const std::lock_guard lock(staging_mutex);
    const cuda::StreamScratch<float> scratch(staged.size() * kStagedStride, stream);
    for (size_t i = 0; i < staged.size(); ++i) {
      float* slot = scratch.get() + i * kStagedStride;
      if (!staged[i].is_output)
        QMESH_CHECK_CUDA(cudaMemcpyAsync(slot, staged[i].source, sizeof(float),
                                         cudaMemcpyDeviceToDevice, stream));
      set_attr(desc, staged[i].attr, static_cast<const float*>(slot));
    }
    const cublasStatus_t status = matmul(a, stream, workspace);
    for (size_t i = 0; i < staged.size(); ++i)
      if (staged[i].is_output && status == CUBLAS_STATUS_SUCCESS)
        QMESH_CHECK_CUDA(cudaMemcpyAsync(staged[i].source, scratch.get() + i * kStagedStride,
                                         sizeof(float), cudaMemcpyDeviceToDevice, stream));
    return status;
  }

  void launch(const cublasLtMatmulAlgo_t& a, cudaStream_t stream, void* workspace) {
    QMESH_CHECK_CUBLAS(enqueue(a, stream, workspace));
  }

  // Times each candidate (kWarmUpRuns launches, then kTimedRuns) and returns the fastest; a
  // lower-ranked candidate must beat the best so far by kTuneMargin. A candidate that cuBLASLt
  // refuses at launch is skipped (a heuristic result is not a promise that it runs). D is
  // saved and restored around the trials when the GEMM accumulates into it.
  cublasLtMatmulAlgo_t tune(const std::vector<cublasLtMatmulHeuristicResult_t>& cands,
                            cudaStream_t stream) {
    void* workspace = workspace_for(c.device.index, stream);
    const size_t d_bytes = size_t(c.m) * size_t(c.n) * dtype_size(c.d_dtype);
    std::optional<cuda::StreamScratch<std::byte>> saved;
    if (c.beta != 0.0f)
      QMESH_CHECK_CUDA(cudaMemcpyAsync(saved.emplace(d_bytes, stream).get(), c.d, d_bytes,
                                       cudaMemcpyDeviceToDevice, stream));
    TimingEvents events;
    cudaEvent_t start = events.start, stop = events.stop;
    float best_ms = 0.0f;
    size_t best = cands.size();
    for (size_t i = 0; i < cands.size(); ++i) {
      const cublasStatus_t warm_up = enqueue(cands[i].algo, stream, workspace);
      if (warm_up != CUBLAS_STATUS_SUCCESS) {
        QMESH_LOG_DEBUG("GEMM autotune candidate ", i,
                        " refused: ", cublasLtGetStatusName(warm_up));
        continue;
      }
      for (int r = 1; r < kWarmUpRuns; ++r) launch(cands[i].algo, stream, workspace);
      QMESH_CHECK_CUDA(cudaEventRecord(start, stream));
      for (int r = 0; r < kTimedRuns; ++r) launch(cands[i].algo, stream, workspace);
      QMESH_CHECK_CUDA(cudaEventRecord(stop, stream));
      QMESH_CHECK_CUDA(cudaEventSynchronize(stop));
      float ms = 0.0f;
      QMESH_CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
      QMESH_LOG_DEBUG("GEMM autotune candidate ", i, ": ", ms / kTimedRuns, " ms");
      if (best == cands.size() || ms < best_ms * (1.0f - kTuneMargin)) {
        best_ms = ms;
        best = i;
      }
    }
    if (saved)
      QMESH_CHECK_CUDA(
          cudaMemcpyAsync(c.d, saved->get(), d_bytes, cudaMemcpyDeviceToDevice, stream));
    QMESH_CHECK(best < cands.size(), "cuBLASLt refused to launch every one of the ", cands.size(),
                " algorithms its heuristic offered for ", problem_key(c),
                " (QMESH_LOG_LEVEL=debug shows each status)");
    QMESH_LOG_INFO("GEMM autotune chose candidate ", best, " of ", cands.size(), " (",
                   best_ms / kTimedRuns, " ms) for ", problem_key(c));
    return cands[best].algo;
  }

  bool capturing(cudaStream_t stream) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    QMESH_CHECK_CUDA(cudaStreamIsCapturing(stream, &status));
    return status != cudaStreamCaptureStatusNone;
  }

  // The heuristic's first candidate, asked of cuBLASLt once per problem.
  cublasLtMatmulAlgo_t heuristic_algo() {
    const std::string key = problem_key(c);
    if (auto cached = cached_gemm_algo(AlgoChoice::kHeuristic, key)) return *cached;
    const cublasLtMatmulAlgo_t first = candidates().front().algo;
    remember_gemm_algo(AlgoChoice::kHeuristic, key, first);
    return first;
  }

  // A tuned algorithm for `key` from this process or the cache file, if cuBLASLt still
  // accepts it here (a file may come from another GPU or library version).
  std::optional<cublasLtMatmulAlgo_t> usable_tuned_algo(const std::string& key) {
    const auto cached = cached_gemm_algo(AlgoChoice::kTuned, key);
    if (!cached) return std::nullopt;
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(handle, desc, a_layout, b_layout, c_layout, d_layout, &*cached,
                                &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > kCublasLtWorkspaceBytes)
      return std::nullopt;
    return cached;
  }

  void choose_algo(cudaStream_t stream) {
    if (!gemm_autotune_enabled()) {
      algo = heuristic_algo();
      return;
    }
    const std::string key = problem_key(c);
    if (auto tuned = usable_tuned_algo(key)) {
      algo = *tuned;
      return;
    }
    // Timing needs to synchronize, which a capturing stream (CUDA graph) forbids: the
    // heuristic's choice there, tuned later outside the capture.
    if (capturing(stream)) {
      algo = heuristic_algo();
      return;
    }
    const auto cands = candidates();
    algo = cands.size() == 1 ? cands.front().algo : tune(cands, stream);
    remember_gemm_algo(AlgoChoice::kTuned, key, algo);
  }
};

namespace {

// Descriptors of `c` on its device, ready to ask for algorithms.
std::unique_ptr<CublasLtGemm::Impl> described(const CanonicalGemm& c) {
  auto impl = std::make_unique<CublasLtGemm::Impl>();
  impl->c = c;
  impl->alpha = c.alpha;
  impl->beta = c.beta;
  impl->handle = handle_for(c.device.index);
  impl->describe();
  return impl;
}

// The plans of run_planned, one per problem and kept for the life of the process (like the
// handles). A plan is built and re-pointed under its own mutex, so that one problem's first
// call (which may autotune) holds up no other problem.
struct Plan {
  std::mutex mutex;
  std::unique_ptr<CublasLtGemm::Impl> impl;
};

struct Plans {
  std::mutex mutex;
  std::map<GemmProblem, std::unique_ptr<Plan>> by_problem;
};

Plan& plan_for(const GemmProblem& problem) {
  static Plans* plans = new Plans;
  std::lock_guard lock(plans->mutex);
  std::unique_ptr<Plan>& plan = plans->by_problem[problem];
  if (!plan) plan = std::make_unique<Plan>();
  return *plan;
}

}  // namespace

void CublasLtGemm::run_planned(const CanonicalGemm& c, void* stream, void* workspace) {
  DeviceGuard guard(c.device.index);
  auto s = static_cast<cudaStream_t>(stream);
  Plan& plan = plan_for(gemm_problem(c));
  std::lock_guard lock(plan.mutex);
  if (plan.impl) {
    plan.impl->point_at(c);
  } else {
    auto impl = described(c);
    impl->choose_algo(s);
    plan.impl = std::move(impl);
  }
  plan.impl->launch(plan.impl->algo, s, workspace ? workspace : workspace_for(c.device.index, s));
}

CublasLtGemm::CublasLtGemm(const CanonicalGemm& c, void* stream) {
  DeviceGuard guard(c.device.index);
  cuda::require_device_scalar(c.a.scale_inv, c.device.index, "GemmArgs a.scale_inv");
  cuda::require_device_scalar(c.b.scale_inv, c.device.index, "GemmArgs b.scale_inv");
  cuda::require_device_scalar(c.d_scale, c.device.index, "GemmArgs d_scale");
  cuda::require_device_scalar(c.d_amax, c.device.index, "GemmArgs d_amax");
  impl_ = described(c);
  impl_->choose_algo(static_cast<cudaStream_t>(stream));
}

void CublasLtGemm::check_supported(const CanonicalGemm& c) {
  DeviceGuard guard(c.device.index);
  (void)described(c)->heuristic_algo();
}

CublasLtGemm::~CublasLtGemm() = default;

void CublasLtGemm::run(void* stream, void* workspace) {
  DeviceGuard guard(impl_->c.device.index);
  auto s = static_cast<cudaStream_t>(stream);
  impl_->launch(impl_->algo, s, workspace ? workspace : workspace_for(impl_->c.device.index, s));
}

}  // namespace qmesh::detail
