// Quantized GEMM: D = epilogue(alpha · op(A) · op(B) [+ D]) on the host (OpenBLAS) or on a
// CUDA device (cuBLASLt).
//
// Layout conventions (row-major throughout, like every qmesh tensor):
//   op(A) is [M, K] and op(B) is [K, N]; D is [M, N].
//   trans_a = kNo:  A is stored [M, K].   trans_a = kYes: A is stored [K, M].
//   trans_b = kNo:  B is stored [K, N].   trans_b = kYes: B is stored [N, K].
// The canonical FP8 form is "TN": trans_a = kNo, trans_b = kYes, i.e. D = A · Bᵀ with A [M, K]
// and B [N, K], both contiguous along K. It is the layer forward y = x · Wᵀ with the weight
// W stored [out, in]. The backward GEMMs are the other forms:
//   dgrad  dx = dy · W      A = dy [M, N_out] (kNo), B = W [N_out, K_in] (kNo)
//   wgrad  dW = dyᵀ · x     A = dy [tokens, out] (kYes), B = x [tokens, in] (kNo)
// Hopper's FP8 tensor cores only take the TN form, so on CUDA an FP8 operand whose stored
// rowwise layout is not contiguous along K is read from its columnwise copy (`data_t`, made
// by cast_transpose); there is never a transpose pass at GEMM time, and a missing copy is
// refused with an error that says so. The host backend reads any layout.
//
// Numerics: an FP8 operand contributes code · scale_inv; the product is accumulated in fp32.
// A block-scaled FP8 operand (Float8BlockScaling, qmesh/block_quantized_tensor.h) has one
// scale_inv per 1x128 slice or 128x128 tile; it is always read from its copy that is
// contiguous along K (on the host too), so that every 1x128 block lies along K, and both
// operands must then be block-scaled (docs/design/block_scaling.md "GEMM").
// Then, in this order: alpha, + D's old value (kAccumulate), + bias, GELU / dGELU; the fp32
// result r is stored in D's dtype. An FP8 D stores sat_rne(r · d_scale) and writes
// amax(D) = max |r| (before scaling; NaN if r holds a NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "qmesh/block_quantized_tensor.h"
#include "qmesh/export.h"
#include "qmesh/mxfp8_tensor.h"
#include "qmesh/nvfp4_tensor.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/status.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"

namespace qmesh {

// One GEMM input: a plain tensor (fp32, bf16, fp16), a per-tensor scaled FP8 tensor, a
// block-scaled FP8 tensor or a microscaled (MXFP8 or NVFP4) tensor. Exactly one of the views
// is set; build it with plain(), fp8(), fp8_block(), mxfp8() or nvfp4().
struct QMESH_API GemmOperand {
  TensorView tensor;               // plain operand, 2-D view of its shape
  QuantizedTensorView quantized;   // FP8 operand (rowwise data and, optionally, data_t)
  BlockQuantizedTensorView block;  // block-scaled FP8 operand (data and, optionally, data_t)
  MxFp8TensorView mx;              // MXFP8 operand (data and, optionally, data_t)
  NvFp4TensorView nv;              // NVFP4 operand (data and, optionally, data_t)

  static GemmOperand plain(const TensorView& t);
  static GemmOperand fp8(const QuantizedTensorView& q);
  // Activations and gradients: 1x128 blocks; weights: 128x128 tiles. The copy contiguous
  // along K is read (data_t where the flag says the rowwise data is not), with its own scales.
  static GemmOperand fp8_block(const BlockQuantizedTensorView& q);
  // MXFP8: 1x32 blocks along K, read from the copy contiguous along K; the GEMM runs natively
  // on compute capability 10.0+, emulated elsewhere where asked (qmesh/ops/gemm_emulation.h).
  static GemmOperand mxfp8(const MxFp8TensorView& q);
  // NVFP4: 1x16 blocks (or 16x16 tiles) along K, read from the copy contiguous along K; the
  // wgrad operands' columnwise copies may hold the random Hadamard transform (both operands
  // with the same signs: it cancels in the product). Emulated where asked, like MXFP8.
  static GemmOperand nvfp4(const NvFp4TensorView& q);
  bool is_quantized() const { return !quantized.data.empty(); }
  bool is_block_scaled() const { return !block.data.empty(); }
  bool is_nvfp4() const { return !nv.data.empty(); }
  bool is_microscaled() const { return !mx.data.empty() || is_nvfp4(); }
  // The rowwise data: the tensor or the FP8 codes.
  const TensorView& stored() const {
    return is_quantized()      ? quantized.data
           : is_block_scaled() ? block.data
           : is_nvfp4()        ? nv.data
           : is_microscaled()  ? mx.data
                               : tensor;
  }
  // dtype / device of the rowwise data.
  DType dtype() const { return stored().dtype; }
  Device device() const { return stored().device; }
};

enum class GemmTranspose : uint8_t { kNo, kYes };

// What happens to the fp32 product before it is stored (see the numerics note above).
enum class GemmEpilogue : uint8_t {
  kNone,
  kBias,         // r += bias[n]; bias [N]
  kGelu,         // r = gelu(r), tanh approximation
  kBiasGeluAux,  // aux = r + bias[n] (pre-activation, saved for backward); r = gelu(aux)
  kDGelu,        // r = r · gelu'(aux); aux [M, N] is the saved pre-activation (an input)
  kBiasGrad,     // dbias[m] = sum_k op(A)[m, k] (no alpha), written to `bias` [M]; in the
                 // weight-gradient GEMM dW = dyᵀ · x these are the column sums of dy
};

// "kNone", "kBias", ...: the enumerator's name, for messages and logs.
QMESH_API const char* gemm_epilogue_name(GemmEpilogue e);

// kWrite: D = result.  kAccumulate: D = result + D (beta = 1), for gradient accumulation;
// not available with an FP8 D.
enum class GemmOutputMode : uint8_t { kWrite, kAccumulate };

// FP8 accumulation on Hopper. kFast lets the tensor cores accumulate in reduced precision
// (~14 mantissa bits) between promotions; kSplit promotes to fp32 regularly. The usual choice
// (TransformerEngine's): kFast for the forward GEMM, kSplit for dgrad and wgrad. Ignored by
// the host backend (always fp32) and for non-FP8 inputs.
enum class GemmAccumulation : uint8_t { kFast, kSplit };

struct QMESH_API GemmArgs {
  GemmOperand a;  // A and B: both FP8 (e4m3×e4m3, e4m3×e5m2, e5m2×e4m3), both per-tensor or
  GemmOperand b;  // both block-scaled, or both the same plain dtype (fp32, bf16, fp16); all
                  // tensors on one device
  GemmTranspose trans_a = GemmTranspose::kNo;
  GemmTranspose trans_b = GemmTranspose::kYes;  // the default is the canonical TN form

  TensorView d;              // [M, N]: fp32, bf16, fp16, or FP8 (needs FP8 A and B)
  float* d_scale = nullptr;  // FP8 D only, required: fp32 scalar on D's device
  float* d_amax = nullptr;   // FP8 D only, optional: fp32 scalar on D's device, overwritten
  float alpha = 1.0f;
  GemmOutputMode output = GemmOutputMode::kWrite;

  GemmEpilogue epilogue = GemmEpilogue::kNone;
  TensorView bias;  // kBias, kBiasGeluAux: input [N]; kBiasGrad: output [M]; fp32/bf16/fp16
  TensorView aux;   // kBiasGeluAux: output [M, N]; kDGelu: input [M, N]; fp32/bf16/fp16
  // On CUDA (cuBLASLt's rules): a plain GEMM's bias and aux have D's dtype; an FP8 GEMM's are
  // usually bf16 (fp16 with an fp16 D), and 16-bit with an FP8 D; an aux needs N to be a
  // multiple of 8 (its leading dimension).

  GemmAccumulation accumulation = GemmAccumulation::kFast;

  // Strided batch: batch > 1 runs `batch` independent GEMMs of one shape in one call (one
  // cuBLASLt launch on CUDA). A's and B's stored copies and D are then 3-D, [batch, rows,
  // cols] with each element's matrix as above (contiguous: element i starts i · rows · cols
  // elements in). Everything else is shared by all elements: alpha, the per-tensor FP8
  // scale_inv of A and of B, d_scale, and the bias of kBias ([N], added to every element).
  // Allowed epilogues: kNone, kBias, kGelu; no d_amax; per-tensor FP8 or plain operands only
  // (not block-scaled, MXFP8 or NVFP4); an FP8 operand on CUDA must be stored contiguous
  // along K (its columnwise copy is one 2-D transpose of the whole batch, not per element).
  // Equal, bit for bit on the host, to `batch` calls of the 2-D GEMM.
  int64_t batch = 1;

  // Microscaled (MXFP8, NVFP4) operands: run the GEMM emulated where the device has no native one
  // (qmesh/ops/gemm_emulation.h); false: such a GEMM is an Error there, unless
  // QMESH_BLOCK_EMULATION=1.
  bool emulate_microscaled = false;
};

// A GEMM with the CUTLASS device-operator lifecycle:
//   Gemm::can_implement(args)  -> why not (never throws for bad arguments);
//   Gemm::workspace_size(args) -> bytes of scratch memory on the args' device;
//   gemm.initialize(args, workspace, stream) -> checks and plans (may choose an algorithm);
//   gemm.run(stream)           -> enqueues the GEMM (CUDA) or computes it (host).
// A Gemm object may be run many times on the tensors it was initialized with. Not
// thread-safe; one object per thread.
class QMESH_API Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(Gemm&&) noexcept;
  Gemm& operator=(Gemm&&) noexcept;

  // Checks shapes, dtypes, devices, layouts (the columnwise copy that CUDA FP8 needs,
  // leading dimensions multiple of 16) and the epilogue's tensors; the device's
  // availability is checked last, so argument errors are reported on any machine. On a
  // usable CUDA device it then asks cuBLASLt whether it has an algorithm (some epilogues
  // are not offered with FP8 inputs).
  static Status can_implement(const GemmArgs& args);
  // Scratch bytes that initialize() may be given (host memory for host tensors: fp32
  // panels of dequantized operands; device memory for CUDA: cuBLASLt's 32 MiB).
  static size_t workspace_size(const GemmArgs& args);

  // Throws qmesh::Error with can_implement's reason if the GEMM cannot run, and on CUDA if
  // an FP8 scale_inv, d_scale or d_amax pointer is not in the device's memory. `workspace` is
  // nullptr (use a cached workspace owned by qmesh: per thread on the host, per device and
  // stream on CUDA) or at least workspace_size(args) bytes on the args' device (256-byte
  // aligned on CUDA, as cudaMalloc returns), kept alive and unused by others until the last
  // run() returns (host) or completes (CUDA). The tensors in args must outlive the runs. On
  // CUDA, may time candidate algorithms on `stream` when autotuning is on (docs/params.md:
  // QMESH_GEMM_AUTOTUNE).
  void initialize(const GemmArgs& args, void* workspace, Stream stream);
  // Host: computes D before returning (stream ignored). CUDA: enqueues on `stream` and
  // returns without waiting. Error if initialize() has not succeeded.
  void run(Stream stream);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One-shot convenience: can_implement + initialize (cached workspace) + run.
QMESH_API void gemm(const GemmArgs& args, Stream stream = {});

// gemm() for a caller that runs the same few problems again and again on new buffers (qmesh's
// XLA FFI handler). Checks `args` as gemm() does. On CUDA, the plan of each problem (the
// cuBLASLt descriptors and algorithm for its shapes, layouts, dtypes, epilogue, pointer
// alignments and device) is built at the problem's first call and kept for the life of the
// process; every later call only re-points it at args' tensors and enqueues on `stream`: no
// cuBLASLt query, no synchronization, and no allocation when `workspace` is given (but the
// staging of FP8 scalars that are not 16-byte aligned), so it may be captured in a CUDA graph.
// `workspace`: workspace_size(args) bytes on D's device, 256-byte aligned, unused by others
// until the GEMM completes; or nullptr for the cached workspace of the device and stream
// (allocated at the stream's first GEMM). Unlike gemm(), the FP8 scalar pointers (scale_inv,
// d_scale, d_amax) are not checked: they must be in the memory of D's device. Thread-safe.
// The host backend computes as gemm() (workspace unused).
QMESH_API void gemm_planned(const GemmArgs& args, void* workspace, Stream stream);

}  // namespace qmesh
