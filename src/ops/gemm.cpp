#include "qmesh/ops/gemm.h"

#include <cstdint>

#include "cpu/gemm_cpu.h"
#include "cuda/gemm_cublaslt.h"
#include "ops/gemm_canonical.h"
#include "ops/gemm_emulation.h"
#include "ops/gemm_native_microscaled.h"
#include "ops/microscaled_gemm_path.h"
#include "qmesh/detail/cuda_dispatch.h"
#include "qmesh/error.h"
#include "qmesh/ops/gemm_emulation.h"

namespace qmesh {

GemmOperand GemmOperand::plain(const TensorView& t) {
  GemmOperand op;
  op.tensor = t;
  return op;
}

GemmOperand GemmOperand::fp8(const QuantizedTensorView& q) {
  GemmOperand op;
  op.quantized = q;
  return op;
}

GemmOperand GemmOperand::fp8_block(const BlockQuantizedTensorView& q) {
  GemmOperand op;
  op.block = q;
  return op;
}

GemmOperand GemmOperand::mxfp8(const MxFp8TensorView& q) {
  GemmOperand op;
  op.mx = q;
  return op;
}

GemmOperand GemmOperand::nvfp4(const NvFp4TensorView& q) {
  GemmOperand op;
  op.nv = q;
  return op;
}

const char* gemm_epilogue_name(GemmEpilogue e) {
  switch (e) {
    case GemmEpilogue::kNone:
      return "kNone";
    case GemmEpilogue::kBias:
      return "kBias";
    case GemmEpilogue::kGelu:
      return "kGelu";
    case GemmEpilogue::kBiasGeluAux:
      return "kBiasGeluAux";
    case GemmEpilogue::kDGelu:
      return "kDGelu";
    case GemmEpilogue::kBiasGrad:
      return "kBiasGrad";
  }
  QMESH_THROW("GemmEpilogue has the invalid value ", int(e));
}

namespace {

// Where a GEMM of microscaled operands runs (ops/microscaled_gemm_path.h); the operands'
// errors come before the device's.
bool runs_natively(const GemmArgs& args) {
  const detail::MicroscaledCopies c = detail::checked_copies(args);
  const bool emulate = args.emulate_microscaled || block_emulation_from_env();
  return detail::choose_microscaled_gemm_path(detail::microscaled_gemm_target(args.d.device),
                                              c.a.is_nvfp4() ? "NVFP4" : "MXFP8",
                                              emulate) == detail::MicroscaledGemmPath::kNative;
}

// The canonical form of args, checked: microscaled operands take the native form or the
// plain form of their emulation.
detail::CanonicalGemm canonical_form(const GemmArgs& args) {
  detail::check_batch(args);
  if (!detail::has_microscaled_operand(args)) return detail::canonicalize(args);
  if (runs_natively(args)) return detail::native_microscaled_probe(args);
  return detail::canonicalize(detail::emulated_probe(args));
}

}  // namespace

struct Gemm::Impl {
  detail::CanonicalGemm c;
  // Microscaled operands: their dequantized copies (emulated) or swizzled scales (native),
  // refreshed by every run.
  std::shared_ptr<detail::EmulatedOperands> emulated;
  std::shared_ptr<detail::NativeMicroscaledOperands> native;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;  // what workspace_size() said at initialize()
  // The cuBLASLt plan of a CUDA GEMM. A shared_ptr binds its deleter where the CUDA branch
  // creates it, so that a build without CUDA never names CublasLtGemm's destructor.
  std::shared_ptr<detail::CublasLtGemm> cublaslt;
};

Gemm::Gemm() = default;
Gemm::~Gemm() = default;
Gemm::Gemm(Gemm&&) noexcept = default;
Gemm& Gemm::operator=(Gemm&&) noexcept = default;

Status Gemm::can_implement(const GemmArgs& args) {
  try {
    const detail::CanonicalGemm c = canonical_form(args);
    if (c.backend == detail::GemmBackend::kCublasLt)
      detail::on_cuda(c.device.index, [&](auto) { detail::CublasLtGemm::check_supported(c); });
    return {};
  } catch (const Error& e) {
    return Status::failure(e.message());
  }
}

size_t Gemm::workspace_size(const GemmArgs& args) {
  const detail::CanonicalGemm c = canonical_form(args);
  if (c.backend == detail::GemmBackend::kCublasLt) return detail::kCublasLtWorkspaceBytes;
  return detail::host_gemm_workspace_size(c);
}

void Gemm::initialize(const GemmArgs& args, void* workspace, Stream stream) {
  detail::check_batch(args);
  auto impl = std::make_unique<Impl>();
  if (!detail::has_microscaled_operand(args)) {
    impl->c = detail::canonicalize(args);
  } else if (runs_natively(args)) {
    impl->native = std::make_shared<detail::NativeMicroscaledOperands>(args);
    impl->c = impl->native->canonical();
  } else {
    impl->emulated = std::make_shared<detail::EmulatedOperands>(args);
    impl->c = detail::canonicalize(impl->emulated->plain());
  }
  impl->workspace = workspace;
  if (impl->c.backend == detail::GemmBackend::kHost)
    impl->workspace_bytes = detail::host_gemm_workspace_size(impl->c);
  if (impl->c.backend == detail::GemmBackend::kCublasLt) {
    QMESH_CHECK(reinterpret_cast<uintptr_t>(workspace) % detail::kCublasLtWorkspaceAlignment == 0,
                "Gemm::initialize: the workspace of a CUDA GEMM must be ",
                detail::kCublasLtWorkspaceAlignment,
                "-byte aligned (cuBLASLt's rule), got address ", workspace,
                ": pass a cudaMalloc'd buffer, or nullptr for the cached workspace");
    detail::on_cuda(impl->c.device.index, [&](auto) {
      impl->cublaslt = std::make_shared<detail::CublasLtGemm>(impl->c, stream.handle);
    });
  }
  impl_ = std::move(impl);
}

void Gemm::run(Stream stream) {
  QMESH_CHECK(impl_ != nullptr, "Gemm::run called before a successful Gemm::initialize");
  if (impl_->emulated) impl_->emulated->refresh(stream);
  if (impl_->native) impl_->native->refresh(stream);
  if (impl_->cublaslt) {
    detail::on_cuda(impl_->c.device.index,
                    [&](auto) { impl_->cublaslt->run(stream.handle, impl_->workspace); });
    return;
  }
  detail::host_gemm(impl_->c, impl_->workspace, impl_->workspace_bytes);
}

void gemm(const GemmArgs& args, Stream stream) {
  Gemm op;
  op.initialize(args, nullptr, stream);
  op.run(stream);
}

void gemm_planned(const GemmArgs& args, void* workspace, Stream stream) {
  if (detail::has_microscaled_operand(args)) {  // owns its dequantized operands or scales
    gemm(args, stream);
    return;
  }
  const detail::CanonicalGemm c = detail::canonicalize(args);
  if (c.backend == detail::GemmBackend::kHost) {
    detail::host_gemm(c, nullptr, 0);
    return;
  }
  QMESH_CHECK(reinterpret_cast<uintptr_t>(workspace) % detail::kCublasLtWorkspaceAlignment == 0,
              "gemm_planned: the workspace of a CUDA GEMM must be ",
              detail::kCublasLtWorkspaceAlignment, "-byte aligned (cuBLASLt's rule), got address ",
              workspace);
  detail::on_cuda(c.device.index,
                  [&](auto) { detail::CublasLtGemm::run_planned(c, stream.handle, workspace); });
}

}  // namespace qmesh
