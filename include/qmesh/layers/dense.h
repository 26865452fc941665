// Dense layers, unsharded or tensor-parallel (Megatron-style), FP8 or high precision:
//
//   y = x · Wᵀ + b   (then GELU for activation kGelu),   W [out, in] (fp32 master).
//
// Sharding over the mesh's tp axis (tp ranks), with T tokens per data-parallel rank:
//   kNone:   x [T, in] -> y [T, out].
//   kColumn: W rows sharded: W [out/tp, in], b [out/tp]. x [T, in] replicated
//            (sequence_parallel: x [T/tp, in], all-gathered first) -> y [T, out/tp].
//            Backward reduces dx over tp (all-reduce; sequence_parallel: reduce-scatter,
//            and GatheredInput says whether wgrad's gathered x is kept or gathered again).
//   kRow:    W columns sharded: W [out, in/tp], b [out] replicated. x [T, in/tp] ->
//            partial sums all-reduced (sequence_parallel: reduce-scattered to [T/tp, out]),
//            then + b. Backward all-gathers dy first under sequence_parallel.
// Under sequence_parallel the all-gather + GEMM and GEMM + reduce-scatter pairs run as the
// collective GEMMs of qmesh/overlap/collective_gemm.h with the layer's Overlap schedule;
// every schedule gives the same bits (the gathered operand is the cast chunk: FP8 codes or
// bf16, not fp32). Under Recipe::kFp8Block the high-precision shard is gathered before the
// block cast and the reduce-scatter follows the GEMM (no collective GEMM, no overlap), and
// with tp > 1 the sharded feature count must be a multiple of 128 (whole scaling blocks).
// The same global input gives the same output and gradients (to rounding) for every tp.
//
// Precision (LayerContext::recipe): each GEMM operand is cast to bf16 or quantized to FP8
// (x and W in E4M3, the output gradient in E5M2 under the HYBRID format), each with its own
// scaling state; GEMMs accumulate in fp32. Activations are fp32 or bf16 tensors: x and dy
// either (dx has x's dtype), y in DenseOptions::output_dtype (the pre-activation that GELU's
// backward reads too); a bf16 activation is the BF16 recipe's operand as it is, and the FP8
// casts read it directly (half the bytes of fp32).
//
// Device (LayerContext::placement): parameters, activations and scratch live on the context's
// device; on CUDA every call is asynchronous on the context's stream (GEMMs, casts, bias and
// GELU kernels, and the tp collectives, which must then carry CUDA buffers: NCCL or the local
// backend). sequence_parallel on CUDA runs the collective GEMMs with their transfers on the
// placement's comm_stream (required there), and GatheredInput::kRegather's second gather
// runs there too, beside the dgrad GEMM.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "qmesh/export.h"
#include "qmesh/layers/layer_context.h"
#include "qmesh/layers/parameter.h"
#include "qmesh/quantized_tensor.h"
#include "qmesh/tensor.h"

namespace qmesh {

enum class DenseParallelism { kNone, kColumn, kRow };
enum class DenseActivation { kNone, kGelu };  // GELU: tanh approximation

// What a column-parallel, sequence-parallel layer keeps of its all-gathered input for the
// weight gradient (ignored by other layers).
enum class GatheredInput {
  kSave,      // the gathered [T, in] operand from forward (one such buffer per layer)
  kRegather,  // only this rank's [T/tp, in] chunk: forward gathers into the context's shared
              // buffer, and backward all-gathers the chunk again, asynchronously, while the
              // dgrad GEMM runs (bulk overlap). The same bits as kSave.
};

// How the last forward GEMM applied the bias and GELU (Dense::forward_epilogue()).
enum class DenseEpilogue : uint8_t {
  kNone,       // no bias
  kFused,      // bias (and GELU, saving the pre-activation) in the GEMM's epilogue
  kBiasFused,  // bias in the GEMM, GELU a separate pass (the backend fuses no GELU here)
  kSeparate,   // a plain GEMM, then the bias and GELU passes
};
// "none", "fused", "bias_fused", "separate".
QMESH_API const char* dense_epilogue_name(DenseEpilogue e);

// Splits a GELU between two consecutive layers so that it runs inside their FP8 casts
// (LayerNormMLP's FP8 path: the activated [T, ffn] tensor is never written in fp32):
enum class DenseGeluSplit {
  kNone,
  // With activation kGelu: forward returns the pre-activation (bias added, no GELU); backward
  // takes the gradient w.r.t. GELU's output and applies GELU's backward in the cast of dy,
  // together with the bias gradient.
  kProducer,
  // With activation kNone: the input is a pre-activation; forward applies GELU to it in the
  // input's cast, and backward returns the gradient w.r.t. GELU's output.
  kConsumer,
};

struct DenseOptions {
  DenseParallelism parallelism = DenseParallelism::kNone;
  bool sequence_parallel = false;  // only with kColumn / kRow
  bool bias = true;
  DenseActivation activation = DenseActivation::kNone;  // not with kRow (needs full sums)
  // Collective-GEMM schedule under sequence_parallel (ignored otherwise); unset: the
  // LayerContext's overlap() at construction.
  std::optional<Overlap> overlap;
  GatheredInput gathered_input = GatheredInput::kSave;
  DenseGeluSplit gelu_split = DenseGeluSplit::kNone;
  // The dtype of y (and of the saved pre-activation): fp32 or bf16, rounded from the fp32
  // accumulator (with the bias, and GELU, applied before rounding where the GEMM's epilogue
  // fuses them; each pass rounds where they run separately). fp32 only for kRow and under
  // Recipe::kFp32.
  DType output_dtype = DType::kFloat32;
};

struct CastFusion;  // internal (src/layers/operand_cast.h)

class QMESH_API Dense {
 public:
  // in_features / out_features are the global (unsharded) sizes; the sharded one must be
  // divisible by tp (Error otherwise). Weights are drawn from N(0, 1/in_features) by a
  // counter-based generator keyed by (seed, global element index), so every sharding of
  // the same seed holds slices of the same global matrix; biases start at 0. Registers its
  // FP8 operands with ctx's scaling states when the recipe is FP8.
  Dense(std::string name, int64_t in_features, int64_t out_features, DenseOptions options,
        LayerContext& ctx, uint64_t seed);
  ~Dense();
  Dense(Dense&&) noexcept;
  Dense& operator=(Dense&&) = delete;

  // x: fp32 or bf16 (kColumn: fp32) on the context's device, [tokens, in_local] (see the
  // sharding table). Returns y (output_dtype), owned by the layer and valid until the next
  // forward. x must stay alive and unchanged until backward.
  // With `residual` (fp32, shaped like y, on the context's device; only without GELU and with
  // an fp32 output): y = x · Wᵀ + b + residual. At tp = 1 without sequence parallelism, where
  // the backend offers it, one GEMM does it all (D = the residual, accumulated, the bias in the
  // epilogue: forward_epilogue() kFused); otherwise the bias and the residual are separate
  // passes after the reduction over tp.
  TensorView forward(const TensorView& x, const TensorView& residual = {});
  // dy: gradient of the loss w.r.t. forward's output (after GELU for kGelu), shaped like it;
  // fp32 or bf16 (with GELU: y's dtype). Writes weight.grad and bias.grad; returns dx (owned by
  // the layer) shaped like x, of x's dtype.
  TensorView backward(const TensorView& dy);

  std::vector<Parameter*> parameters();
  Parameter& weight();
  const DenseOptions& options() const;
  // The epilogue the last forward ran (kNone before the first). The forward GEMM asks for
  // the bias+GELU epilogue, with the bias in bf16 when its operands are FP8 (what cuBLASLt
  // fuses with FP8 inputs) and fp32 otherwise; where the backend does not offer it, the
  // bias alone, else separate passes: the same math, in more passes.
  DenseEpilogue forward_epilogue() const;

 private:
  friend class LayerNormMLP;
  friend class LayerNormDense;
  // forward(x) with `input_fusion` applied in x's cast (a LayerNorm of x computed in the cast
  // that feeds this layer's GEMM: LayerNorm::fused_forward).
  TensorView forward_fused(const TensorView& x, const CastFusion& input_fusion);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qmesh
