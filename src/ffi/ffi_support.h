// What every XLA FFI handler of qmesh shares: where it runs, how XLA's buffers become qmesh
// tensor views, and the conversion of qmesh::Error into an FFI error at the ABI edge.
//
// A handler is written once as `void impl(const Where&, <decoded arguments>...)` that throws
// qmesh::Error on bad input; QMESH_FFI_HANDLER defines its exported CPU symbol (and, in a CUDA
// build, its CUDA symbol, which also decodes XLA's stream and device ordinal).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "qmesh/config.h"
#include "qmesh/device.h"
#include "qmesh/dtype.h"
#include "qmesh/error.h"
#include "qmesh/export.h"
#include "qmesh/ops/gemm.h"
#include "qmesh/ops/nvfp4_quantize.h"
#include "qmesh/shape.h"
#include "qmesh/stream.h"
#include "qmesh/tensor.h"
#include "xla/ffi/api/ffi.h"

#if defined(__SSE__)
#include <xmmintrin.h>
#endif

namespace qmesh::ffi {

namespace xffi = ::xla::ffi;
using xffi::AnyBuffer;
using xffi::Result;

// The device a handler runs on and the stream its work is ordered on (null on the host).
struct Where {
  Device device;
  Stream stream;
};

// The qmesh dtype of an XLA element type; Error naming `what` for any other type.
DType to_dtype(xffi::DataType type, const std::string& what);

// Element count of a buffer (0 for an empty array).
int64_t element_count(const AnyBuffer& buffer);

// A view of a non-empty buffer on `where.device`, shaped like the buffer (rank 0 -> [1]).
// Error naming `what` when the buffer is empty.
TensorView view(const AnyBuffer& buffer, const Where& where, const std::string& what);
TensorView view(Result<AnyBuffer>& buffer, const Where& where, const std::string& what);
// view() of x read as its row-major 2-D view [rows, cols] (Shape::rows / cols).
TensorView matrix_view(const AnyBuffer& x, const Where& where, const std::string& what);
// NvFp4Options with the random Hadamard transform of the rht / rht_signs attributes (Error
// unless rht_signs is a 16-bit mask); the other options at their defaults.
NvFp4Options nvfp4_transform(bool rht, int32_t rht_signs);
// NVFP4's packed codes of a copy with `rows` rows: uint8 [rows, cols / 2] read as
// fp4e2m1x2 [rows, cols / 2]; Error naming `what` for another dtype or element count.
TensorView packed_view(const AnyBuffer& buffer, const Where& w, int64_t rows, const char* what);

// Error naming `what` unless the buffer has one of `allowed` dtypes.
void require_dtype(const AnyBuffer& buffer, std::initializer_list<DType> allowed,
                   const std::string& what);
// Error naming `what` unless the buffer holds exactly `count` elements.
void require_count(const AnyBuffer& buffer, int64_t count, const std::string& what);

// Error naming `what` unless the buffer has `rank` dimensions.
void require_rank(const AnyBuffer& buffer, size_t rank, const std::string& what);

// One GEMM input of rank `rank` (2; 3 for a strided batch, [batch, rows, cols]): a plain tensor,
// FP8 codes with their fp32 scale_inv [1], or block-scaled FP8 codes (`block` 1: 1x128, 2: 128x128)
// with their scale tensor. An FP8 operand's scale and amax point at its scale_inv (validate() wants
// them set; the GEMMs only read scale_inv). Error naming `what` / `scale_what` for a bad operand.
GemmOperand gemm_operand(const Where& w, const AnyBuffer& x, const AnyBuffer& scale_inv,
                         int32_t block, const char* what, const char* scale_what, size_t rank = 2);

// The row counts of a group_sizes operand (int32 [G], G >= 1) as host integers (a device
// operand is copied, stream-ordered, and waited for); Error unless each is >= 0 and a multiple
// of `row_block` (the op's block edge along the rows; 1 for none; checked before a handler
// views the groups' columnwise scales) and they add up to `rows`.
std::vector<int32_t> group_rows(const Where& where, const AnyBuffer& sizes, int64_t rows,
                                int64_t row_block = 1);

// Bytes of the workspace result that the CUDA GEMM handler takes (cuBLASLt's workspace and
// room to align it to 256 bytes; gemm_handlers.cpp).
size_t gemm_workspace_result_bytes();

// Writes one fp32 value into a device or host scalar, ordered on where.stream.
void store_scalar(float* dst, float value, const Where& where);

// The FFI error code of each kind of qmesh::Error: invalid argument -> kInvalidArgument,
// unsupported -> kUnimplemented, timeout -> kDeadlineExceeded, runtime -> kInternal.
xffi::ErrorCode error_code(ErrorKind kind);

// Runs `body`, turning every exception into an FFI error whose message names the handler (a
// qmesh::Error with the code of its kind): nothing is thrown across the C boundary and
// nothing aborts the process.
template <class Body>
xffi::Error guarded(const char* handler, Body&& body) {
  try {
    std::forward<Body>(body)();
    return xffi::Error::Success();
  } catch (const Error& e) {
    return xffi::Error(error_code(e.kind()), std::string(handler) + ": " + e.message());
  } catch (const std::exception& e) {
    return xffi::Error::Internal(std::string(handler) + ": " + e.what());
  } catch (...) {
    return xffi::Error::Internal(std::string(handler) + ": unknown exception");
  }
}

// The CUDA device ordinal XLA runs the call on (context decoding for the CUDA handlers).
struct DeviceOrdinal {};

}  // namespace qmesh::ffi

namespace xla::ffi {
template <>
struct CtxDecoding<::qmesh::ffi::DeviceOrdinal> {
  using Type = int;
  static std::optional<int> Decode(const XLA_FFI_Api* api, XLA_FFI_ExecutionContext* ctx,
                                   DiagnosticEngine& diagnostic) {
    XLA_FFI_DeviceOrdinal_Get_Args args;
    args.struct_size = XLA_FFI_DeviceOrdinal_Get_Args_STRUCT_SIZE;
    args.extension_start = nullptr;
    args.ctx = ctx;
    args.device_ordinal = 0;
    if (XLA_FFI_Error* error = api->XLA_FFI_DeviceOrdinal_Get(&args)) {
      diagnostic.Emit("cannot get the device ordinal: ") << internal::GetErrorMessage(api, error);
      internal::DestroyError(api, error);
      return std::nullopt;
    }
    return args.device_ordinal;
  }
};
}  // namespace xla::ffi

namespace qmesh::ffi {

// XLA runs its CPU threads with flush-to-zero and denormals-are-zero. qmesh's host ops are
// IEEE (bit-identical to the C++ library and to CUDA's FP8 conversions, denormals included),
// so a host handler turns both off while it runs and restores XLA's mode afterwards.
class IeeeDenormals {
 public:
#if defined(__SSE__)
  IeeeDenormals() : csr_(_mm_getcsr()) { _mm_setcsr(csr_ & ~kFlushBits); }
  ~IeeeDenormals() { _mm_setcsr(csr_); }

 private:
  static constexpr unsigned kFlushBits = 0x8040;  // MXCSR FTZ (bit 15) and DAZ (bit 6)
  unsigned csr_;
#endif
};

// Adapters from XLA's decoded arguments to `impl(const Where&, args...)`.
template <class Impl>
auto on_host(const char* name, Impl impl) {
  return [name, impl](auto... args) {
    const IeeeDenormals ieee;
    return guarded(name, [&] { impl(Where{Device::host(), {}}, std::move(args)...); });
  };
}
template <class Impl>
auto on_cuda(const char* name, Impl impl) {
  return [name, impl](void* stream, int ordinal, auto... args) {
    return guarded(name, [&] { impl(Where{Device::cuda(ordinal), {stream}}, std::move(args)...); });
  };
}

}  // namespace qmesh::ffi

// QMESH_FFI_HANDLER(Name, impl, .Arg<...>()...): the exported symbols NameCpu (and NameCuda in a
// CUDA build) that XLA calls; Python registers them as targets for platforms "cpu" / "CUDA".
// The binding lists the operands, results and attributes in the order impl takes them.
#define QMESH_FFI_HANDLER(name, impl, ...) \
  QMESH_FFI_HANDLER_WITH_TRAITS(name, impl, {}, __VA_ARGS__)

// QMESH_FFI_HANDLER with `traits`, a braced list of xla::ffi::Traits for the CUDA handler:
// {::xla::ffi::Traits::kCmdBufferCompatible} lets XLA capture the call in a command buffer
// (a CUDA graph). Declare it only for a handler whose every CUDA call launches work on the
// stream XLA gives and nothing else: no allocation (buffers come from XLA), no
// synchronization, no autotuning.
#define QMESH_FFI_HANDLER_WITH_TRAITS(name, impl, traits, ...)                 \
  extern "C" QMESH_API XLA_FFI_Error* name##Cpu(XLA_FFI_CallFrame*);           \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name##Cpu, ::qmesh::ffi::on_host(#name, impl), \
                                ::xla::ffi::Ffi::Bind() __VA_ARGS__);          \
  QMESH_FFI_CUDA_HANDLER(name, impl, traits, __VA_ARGS__)

// The one preprocessor branch on QMESH_WITH_CUDA left in src/: it decides which exported
// symbols exist, which neither a template nor if constexpr can do at namespace scope. A build
// without CUDA exports no NameCuda symbol (python/qmesh registers them only when
// qmesh_jax_has_cuda() says so) rather than handlers that could only fail.
#if QMESH_WITH_CUDA
#define QMESH_FFI_CUDA_HANDLER(name, impl, traits, ...)                              \
  extern "C" QMESH_API XLA_FFI_Error* name##Cuda(XLA_FFI_CallFrame*);                \
  XLA_FFI_DEFINE_HANDLER_SYMBOL(name##Cuda, ::qmesh::ffi::on_cuda(#name, impl),      \
                                ::xla::ffi::Ffi::Bind()                              \
                                    .Ctx<::xla::ffi::PlatformStream<void*>>()        \
                                    .Ctx<::qmesh::ffi::DeviceOrdinal>() __VA_ARGS__, \
                                traits);
#else
#define QMESH_FFI_CUDA_HANDLER(name, impl, traits, ...)
#endif
